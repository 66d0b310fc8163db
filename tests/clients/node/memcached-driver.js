// node `memcached` (text protocol) driven by the matrix: see serve.js and
// tests/clients/driver.py. Usage: node memcached-driver.js HOST PORT
'use strict';
const Memcached = require('memcached');
const { serve, unhex, value } = require('./serve');

const server = process.argv[2] + ':' + process.argv[3];
const mc = new Memcached(server, {
  poolSize: 1,    // one connection: an open read and its close go through it
  idle: 60000,    // default 5000 ms: a connection quiet that long (a get q/t=5000) is dropped
  timeout: 10000,
  retries: 0,
});

function call(method, ...args) {
  return new Promise((resolve, reject) => {
    mc[method](...args, (err, result) => (err ? reject(err) : resolve(result)));
  });
}

// Items are sent as latin1 strings (flags 0); a Buffer would be stored with the
// client's binary flag, which a queue does not keep.
const text = (hex) => unhex(hex).toString('latin1');

async function answer(op, args) {
  switch (op) {
    case 'set':
      return (await call('set', text(args[0]), text(args[1]), 0)) ? 'ok' : 'error set returned false';
    case 'get': {
      const data = await call('get', text(args[0]));
      return data === undefined ? 'none' : value(Buffer.from(data, 'latin1'));
    }
    case 'stat': {
      const name = text(args[0]);
      const [stats] = await call('stats');
      return stats && name in stats ? value(String(stats[name])) : 'none';
    }
    case 'delete':
      return (await call('del', text(args[0]))) ? 'ok' : 'error del returned false';
    case 'flush_all':
      return (await call('flush')).every(Boolean) ? 'ok' : 'error flush returned false';
    case 'version': {
      const [info] = await call('version');
      return value(info.version);
    }
    case 'quit':
      mc.end();
      return 'ok';
    default:
      return 'error unknown request ' + op;
  }
}

serve(answer);
