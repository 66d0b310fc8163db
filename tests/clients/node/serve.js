// The driver protocol of tests/clients/driver.py for the node clients: reads
// one request a line on stdin, calls answer(op, args) (a Promise of the reply
// line), writes the reply; requests are answered one at a time, in order.
'use strict';
const readline = require('readline');

function unhex(text) {
  return Buffer.from(text || '', 'hex');
}

function value(data) {
  return 'value ' + Buffer.from(data).toString('hex');
}

function serve(answer) {
  const lines = readline.createInterface({ input: process.stdin });
  let chain = Promise.resolve();
  lines.on('line', (line) => {
    const [op, ...args] = line.split(' ');
    chain = chain
      .then(() => answer(op, args))
      .catch((err) => 'error ' + String(err && err.stack ? err.message : err).replace(/\n/g, ' '))
      .then((reply) => {
        process.stdout.write(reply + '\n');
        if (op === 'quit') {
          process.exit(0);
        }
      });
  });
  // stdin closed (pytest gone): stop, whatever the client still holds open
  lines.on('close', () => chain.then(() => process.exit(0)));
}

module.exports = { serve, unhex, value };
