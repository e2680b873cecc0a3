// Scenarios of the official RocketMQ 5 Node.js client (npm `rocketmq-client-nodejs`) against a
// raftmq proxy, one process per run: `node driver.js SCENARIO ENDPOINT ARGS_JSON`. Prints one line
// `RESULT {...}` with what the client saw (and `SENT <id>` lines while a stream sends); the tests
// (tests/proxy/test_nodejs_client.py) assert on it. Nothing of raftmq is used here: the client is
// the black box the issue asks for. The twin of tests/proxy/official_client.py (Python client).
'use strict';

const util = require('node:util');
const {
  Producer,
  SimpleConsumer,
  PushConsumer,
  ConsumeResult,
} = require('rocketmq-client-nodejs');
const { TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

// The client's default logger writes under ~/logs; ours goes to stderr, which the test shows
// when a run fails.
const logger = {
  info: (...a) => process.stderr.write(`INFO ${util.format(...a)}\n`),
  warn: (...a) => process.stderr.write(`WARN ${util.format(...a)}\n`),
  error: (...a) => process.stderr.write(`ERROR ${util.format(...a)}\n`),
  debug: () => {},
  close: () => {},
};

// A secure cluster (issue 27): TLS to the proxy (grpc-js trusts the CA named by
// GRPC_DEFAULT_SSL_ROOTS_FILE_PATH) and the user's AK/SK, from the environment.
function security() {
  const out = {};
  if (process.env.RMQ5_TLS === '1') out.sslEnabled = true;
  if (process.env.RMQ5_ACCESS_KEY) {
    out.sessionCredentials = {
      accessKey: process.env.RMQ5_ACCESS_KEY,
      accessSecret: process.env.RMQ5_SECRET_KEY || '',
    };
  }
  return out;
}

function options(endpoint, extra) {
  return { endpoints: endpoint, namespace: '', requestTimeout: 10000, logger, ...security(), ...extra };
}

function view(m) {
  return {
    id: m.messageId,
    body: m.body.toString(),
    tag: m.tag || null,
    keys: [ ...m.keys ].sort(),
    properties: Object.fromEntries(m.properties),
    group: m.messageGroup || null,
    attempt: m.deliveryAttempt,
    born_ms: m.bornTimestamp ? m.bornTimestamp.getTime() : 0,
    handle: m.receiptHandle,
  };
}

function errorText(err) {
  return `${err && err.name}: ${err && err.message}`;
}

async function attempt(fn) {
  try {
    await fn();
  } catch (err) {
    return errorText(err);
  }
  return '';
}

function toMessage(topic, spec) {
  const m = { topic, body: Buffer.from(spec.body) };
  if (spec.tag) m.tag = spec.tag;
  if (spec.keys) m.keys = spec.keys;
  if (spec.properties) m.properties = new Map(Object.entries(spec.properties));
  if (spec.group) m.messageGroup = spec.group;
  return m;
}

async function producer(endpoint, topic, extra = {}) {
  const p = new Producer(options(endpoint, { topic, ...extra }));
  await p.startup();
  return p;
}

// args: topic, messages [{body, tag?, keys?, properties?, group?}]
async function produce(endpoint, args) {
  const p = await producer(endpoint, args.topic);
  const sent = [];
  try {
    for (const spec of args.messages) {
      const r = await p.send(toMessage(args.topic, spec));
      sent.push({ id: r.messageId, offset: r.offset });
    }
  } finally {
    await p.shutdown();
  }
  return { sent };
}

// Send `count` messages one by one (`interval_s` apart), printing `SENT <id>` as each is
// acknowledged (so a test can act mid-run); a failed send is recorded and the run goes on.
async function produceStream(endpoint, args) {
  const p = await producer(endpoint, args.topic, { maxAttempts: 5 });
  const sent = [];
  const failed = [];
  try {
    for (let i = 0; i < args.count; i++) {
      const spec = { body: `s${i}` };
      if (args.groups) spec.group = `g${i % args.groups}`;
      try {
        const r = await p.send(toMessage(args.topic, spec));
        sent.push({ id: r.messageId, body: spec.body });
        process.stdout.write(`SENT ${r.messageId}\n`);
      } catch (err) {
        failed.push(`${i}: ${errorText(err)}`);
      }
      await sleep((args.interval_s || 0) * 1000);
    }
  } finally {
    await p.shutdown();
  }
  return { sent, failed };
}

async function consumer(endpoint, args) {
  const c = new SimpleConsumer(options(endpoint, {
    consumerGroup: args.group,
    subscriptions: new Map([[ args.topic, args.filter || '*' ]]),
    awaitDuration: (args.await_s || 2) * 1000,
  }));
  await c.startup();
  return c;
}

// Receive and ack until `count` messages or `timeout_s`; with `check_empty` one more receive
// must be empty (`extra`: what it got).
async function consume(endpoint, args) {
  const c = await consumer(endpoint, args);
  const got = [];
  let extra = [];
  try {
    const deadline = Date.now() + (args.timeout_s || 30) * 1000;
    while (got.length < args.count && Date.now() < deadline) {
      for (const m of await c.receive(args.batch || 16, (args.invisible_s || 20) * 1000)) {
        got.push(view(m));
        await c.ack(m);
      }
    }
    if (args.check_empty) extra = (await c.receive(16, 20000)).map(view);
  } finally {
    await c.shutdown();
  }
  return { got, extra };
}

async function receiveOne(c, invisibleMs, timeoutS = 20) {
  const deadline = Date.now() + timeoutS * 1000;
  let got = [];
  while (!got.length && Date.now() < deadline) got = await c.receive(1, invisibleMs);
  return got;
}

// Receive one message without acking (invisible 4 s); a receive right after (long polling 1 s)
// must not get it; it comes back after its invisible duration with attempt 2; the old handle is
// then refused and the new one acks.
async function redeliver(endpoint, args) {
  const c = await consumer(endpoint, args);
  const out = {};
  try {
    const first = await receiveOne(c, 4000);
    out.first = first.map(view);
    const t0 = Date.now();
    out.at_once = (await c.receive(1, 4000)).map(view);
    const again = await receiveOne(c, 10000);
    out.again = again.map(view);
    out.again_after_s = (Date.now() - t0) / 1000;
    if (first.length && again.length) {
      out.old_ack_error = await attempt(() => c.ack(first[0]));
      out.new_ack_error = await attempt(() => c.ack(again[0]));
    }
    out.after = (await c.receive(1, 10000)).map(view);
  } finally {
    await c.shutdown();
  }
  return out;
}

// Receive with 2 s invisible, extend to 30 s: it must not come back after 3 s; ack with the new
// handle (the client replaces the message's handle itself).
async function changeInvisible(endpoint, args) {
  const c = await consumer(endpoint, args);
  const out = {};
  try {
    const first = await receiveOne(c, 2000);
    out.first = first.map(view);
    if (first.length) {
      const old = first[0].receiptHandle;
      await c.changeInvisibleDuration(first[0], 30000);
      out.old_handle = old;
      out.new_handle = first[0].receiptHandle;
      await sleep(3000);
      out.meanwhile = (await c.receive(1, 10000)).map(view);
      out.ack_error = await attempt(() => c.ack(first[0]));
    }
  } finally {
    await c.shutdown();
  }
  return out;
}

// Receive everything of an ordered topic, acking each batch in order, and record the order.
async function fifo(endpoint, args) {
  const c = await consumer(endpoint, args);
  const got = [];
  try {
    const deadline = Date.now() + (args.timeout_s || 40) * 1000;
    while (got.length < args.count && Date.now() < deadline) {
      for (const m of await c.receive(args.batch || 4, 20000)) {
        got.push(view(m));
        await c.ack(m);
      }
    }
  } finally {
    await c.shutdown();
  }
  return { got };
}

// A PushConsumer (QueryAssignment, then receives by the client itself) until `count`.
async function push(endpoint, args) {
  const got = [];
  const c = new PushConsumer(options(endpoint, {
    consumerGroup: args.group,
    subscriptions: new Map([[ args.topic, '*' ]]),
    longPollingTimeout: 2000,
    messageListener: {
      async consume(m) {
        got.push(view(m));
        return ConsumeResult.SUCCESS;
      },
    },
  }));
  await c.startup();
  try {
    const deadline = Date.now() + (args.timeout_s || 30) * 1000;
    while (got.length < args.count && Date.now() < deadline) await sleep(200);
  } finally {
    await c.shutdown();
  }
  return { got };
}

// Send one message due `delay_ms` from now, then receive until it arrives: when it was sent,
// due and received (ms since the epoch).
async function delayed(endpoint, args) {
  const p = await producer(endpoint, args.topic);
  const dueMs = Date.now() + args.delay_ms;
  const sentMs = Date.now();
  let r;
  try {
    r = await p.send({ topic: args.topic, body: Buffer.from(args.body), deliveryTimestamp: new Date(dueMs) });
  } finally {
    await p.shutdown();
  }
  const c = await consumer(endpoint, args);
  const got = [];
  const early = [];
  let receivedMs = 0;
  try {
    const deadline = Date.now() + (args.timeout_s || 40) * 1000;
    while (!got.length && Date.now() < deadline) {
      for (const m of await c.receive(16, 20000)) {
        const v = view(m);
        if (Date.now() < dueMs - 50) early.push(v);
        got.push(v);
        receivedMs = Date.now();
        await c.ack(m);
      }
    }
  } finally {
    await c.shutdown();
  }
  return { id: r.messageId, sent_ms: sentMs, due_ms: dueMs, received_ms: receivedMs, got, early };
}

// Three transactions on `topic`: "commit" committed, "rollback" rolled back, "orphan" left open;
// the checker answers the proxy's check-back of the orphan with COMMIT. The producer stays up
// until the checker was asked (or `check_wait_s`).
async function transactions(endpoint, args) {
  const checked = [];
  const p = await producer(endpoint, args.topic, {
    checker: {
      async check(m) {
        checked.push({ id: m.messageId, body: m.body.toString() });
        return TransactionResolution.COMMIT;
      },
    },
  });
  const out = { sent: {} };
  try {
    for (const body of [ 'commit', 'rollback', 'orphan' ]) {
      const t = p.beginTransaction();
      const r = await p.send({ topic: args.topic, body: Buffer.from(body) }, t);
      out.sent[body] = { id: r.messageId, txn: r.transactionId };
      if (body === 'commit') await t.commit();
      else if (body === 'rollback') await t.rollback();
    }
    const deadline = Date.now() + (args.check_wait_s || 40) * 1000;
    while (!checked.length && Date.now() < deadline) await sleep(200);
    await sleep(1000); // the checker's EndTransaction goes out after check() returns
  } finally {
    await p.shutdown();
  }
  out.checked = checked;
  return out;
}

// Several scenarios in one process: {"steps": [[name, args], ...]} -> {"results": [...]}.
async function steps(endpoint, args) {
  const results = [];
  for (const [ name, a ] of args.steps) results.push(await SCENARIOS[name](endpoint, a));
  return { results };
}

const SCENARIOS = {
  steps,
  produce,
  produce_stream: produceStream,
  consume,
  redeliver,
  change_invisible: changeInvisible,
  fifo,
  push,
  delayed,
  transactions,
};

async function main() {
  const [ name, endpoint, raw ] = process.argv.slice(2);
  if (!SCENARIOS[name]) throw new Error(`unknown scenario ${name}; one of ${Object.keys(SCENARIOS)}`);
  const result = await SCENARIOS[name](endpoint, JSON.parse(raw));
  process.stdout.write(`RESULT ${JSON.stringify(result)}\n`);
  // Timers of the client's (route refresh, heartbeats, gRPC channels) may hold the loop open.
  process.exit(0);
}

main().catch(err => {
  process.stderr.write(`FAILED ${err && err.stack}\n${err && err.cause ? `cause: ${err.cause.stack || err.cause}` : ''}\n`);
  process.exit(1);
});
