// memjs (binary protocol) driven by the matrix: see serve.js and
// tests/clients/driver.py. Usage: node memjs-driver.js HOST PORT
'use strict';
const memjs = require('memjs');
const { serve, unhex, value } = require('./serve');

const server = process.argv[2] + ':' + process.argv[3];
const mc = memjs.Client.create(server, {
  timeout: 10,      // seconds; default 0.5: a get q/t=5000 would time out and be sent again
  conntimeout: 10,
  retries: 0,
  logger: { log: (...args) => console.error(...args) },  // stdout carries the protocol
});

function call(method, ...args) {
  return new Promise((resolve, reject) => {
    mc[method](...args, (err, ...results) => (err ? reject(err) : resolve(results)));
  });
}

async function answer(op, args) {
  switch (op) {
    case 'set': {
      const [ok] = await call('set', unhex(args[0]).toString('latin1'), unhex(args[1]), { expires: 0 });
      return ok ? 'ok' : 'error set returned false';
    }
    case 'get': {
      const [data] = await call('get', unhex(args[0]).toString('latin1'));
      return data === null || data === undefined ? 'none' : value(data);
    }
    case 'stat': {
      const name = unhex(args[0]).toString('latin1');
      const [, stats] = await call('stats');
      return stats && name in stats ? value(String(stats[name])) : 'none';
    }
    case 'delete': {
      const [ok] = await call('delete', unhex(args[0]).toString('latin1'));
      return ok ? 'ok' : 'error delete returned false';
    }
    case 'flush_all': {
      const [results] = await call('flush');
      return Object.values(results).every(Boolean) ? 'ok' : 'error flush returned false';
    }
    case 'quit':
      mc.close();
      return 'ok';
    default:
      return 'error unknown request ' + op;
  }
}

serve(answer);
