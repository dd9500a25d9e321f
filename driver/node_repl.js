'use strict';
// toolsd Node REPL driver: runs an agent's code in one persistent vm context.
//
// Same framing as driver/python_repl.py (node 20, no npm packages). The host starts
// `node node_repl.js` with fd 0 = /dev/null, fd 1 = fd 2 = the output pipe, fd 3 = the
// command pipe, fd 4 = the interrupt pipe. Fd 3 carries the session UUID on its first line,
// then one JSON-encoded string of source per line; requests are numbered 1, 2, 3, ... After
// request N every byte the code wrote is in the pipe, then the driver writes
//   "\x1eTOOLSD-" + uuid + ":" + N + ":" + {"status": "ok"|"error"|"interrupted"} + "\n"
//
// Behaviour:
// - The completion value of the code is shown with util.inspect (undefined is not). A Promise
//   completion value is awaited and its result shown.
// - Top-level `await`: a script with it is rewritten as node's own REPL does
//   (internal/repl/await, hence `node --expose-internals`): its body runs in an async
//   function, its top-level declarations hoisted to the context's scope so that later
//   requests see them (`const` becomes `let` there), its last expression's value returned
//   and shown. Code that compiles as a script runs unchanged. Without that module (another
//   node, no flag), top-level await stays a SyntaxError.
// - import() works in the code, with node's own ESM loader (packages of the workspace's
//   node_modules included; bare names are resolved from the current folder).
// - An exception: status "error", its stack (driver frames removed) ends the output.
// - Interrupts: the host writes N as a line on fd 4 (and sends SIGURG, which node ignores).
//   If request N is running, or has been read and not yet begun, its script is broken
//   (breakOnSigint) or its awaited promise abandoned: status "interrupted", context kept. An
//   interrupt for any other request (one that has ended) does nothing: it never reaches a
//   request it was not meant for, and never ends the driver (see "Interrupts" below).
// - A SIGINT from elsewhere breaks a running script; while idle it is ignored.
// - process.exit() from user code ends the driver (the host reports "crashed").
// - Errors thrown later by timers or unhandled rejections are printed, not fatal.
// - `let`/`const` at top level live in the context's script scope: declaring the same name
//   again in a later request is a SyntaxError, as in any script; use `var` or assignment.
//   So are top-level declarations of a script with top-level await (hoisted as `let`).

const fs = require('fs');
const path = require('path');
const readline = require('readline');
const net = require('net');
const { EventEmitter } = require('events');
const util = require('util');
const vm = require('vm');
const Module = require('module');
const { Worker } = require('worker_threads');

const COMMAND_FD = 3;
const INTERRUPT_FD = 4;
const MARKER_PREFIX = '\x1eTOOLSD-';
const DRIVER_FILE = __filename;

// --- Output: every write is synchronous, so nothing the code wrote can trail the sentinel.
// Node writes to a pipe asynchronously (libuv queues what the pipe cannot take) and sets
// O_NONBLOCK on it, which every child then inherits. So process.stdout/stderr are replaced
// before anything touches them, by streams that call fs.writeSync on the blocking fd.

const pause = new Int32Array(new SharedArrayBuffer(4));

function writeAllSync(fd, data) {
  const buf = typeof data === 'string'
    ? Buffer.from(data, 'utf8')
    : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  let done = 0;
  while (done < buf.length) {
    try {
      done += fs.writeSync(fd, buf, done, buf.length - done);
    } catch (err) {
      // Another process (a node child with inherited stdio) may have made the shared pipe
      // non-blocking: wait a moment for the reader instead of losing output.
      if (err.code !== 'EAGAIN') throw err;
      Atomics.wait(pause, 0, 0, 1);
    }
  }
}

function makeOutput(fd) {
  // Not a stream.Writable: an interrupt (breakOnSigint) that lands inside a Writable's own
  // code leaves its state half-set, and every later write waits in its buffer for ever (seen:
  // no console output at all after one timeout). Here a write is one synchronous call that
  // keeps no state, and the rest of a writable stream's face is enough for console, pipe()
  // and code that checks for it.
  const out = new EventEmitter();
  out.fd = fd;
  out.isTTY = false;
  out.writable = true;
  out.write = (chunk, encoding, callback) => {
    if (typeof encoding === 'function') {
      callback = encoding;
      encoding = undefined;
    }
    let error = null;
    try {
      writeAllSync(fd, typeof chunk === 'string' ? Buffer.from(chunk, encoding || 'utf8') : chunk);
    } catch (err) {
      error = err; // the host went away: nothing to write to, and nothing to throw at the code
    }
    if (typeof callback === 'function') process.nextTick(callback, error);
    return true;
  };
  out.end = (chunk, encoding, callback) => {
    if (typeof chunk === 'function') {
      callback = chunk;
      chunk = undefined;
    }
    if (chunk !== undefined && chunk !== null) out.write(chunk, encoding);
    if (typeof callback === 'function') process.nextTick(callback);
    return out; // the fd stays open: it is the driver's output too
  };
  out.cork = () => {};
  out.uncork = () => {};
  out.setDefaultEncoding = () => out;
  return out;
}

const stdout = makeOutput(1);
const stderr = makeOutput(2);
for (const [name, value] of [['stdout', stdout], ['stderr', stderr]]) {
  Object.defineProperty(process, name, {
    value, configurable: true, enumerable: true, writable: true,
  });
}
// As in node's own REPL: no script path in argv (nor the session UUID, which only fd 3 carries).
process.argv.splice(1);
const userConsole = new console.Console({ stdout, stderr });
// Modules the user requires log through the main realm's console: same streams.
for (const key of Object.keys(console)) {
  if (typeof userConsole[key] === 'function') console[key] = userConsole[key].bind(userConsole);
}

// --- The user's context.

function makeContext() {
  const sandbox = {
    console: userConsole,
    process,
    require: Module.createRequire(path.join(process.cwd(), '<repl>')),
    module: undefined,
    exports: undefined,
    Buffer,
    URL,
    URLSearchParams,
    TextEncoder,
    TextDecoder,
    AbortController,
    AbortSignal,
    EventTarget,
    Event,
    atob,
    btoa,
    fetch: globalThis.fetch,
    structuredClone,
    queueMicrotask,
    setTimeout,
    clearTimeout,
    setInterval,
    clearInterval,
    setImmediate,
    clearImmediate,
    performance,
  };
  sandbox.module = { exports: {}, require: sandbox.require };
  sandbox.exports = sandbox.module.exports;
  const context = vm.createContext(sandbox, { name: 'toolsd repl' });
  vm.runInContext('globalThis.global = globalThis;', context);
  return context;
}

// --- Compiling a request.

// import() in the user's scripts: node's own loader (the main context's), which resolves bare
// names from the current folder, as node's REPL does. Node 20.12 and later; before, import()
// throws ERR_VM_DYNAMIC_IMPORT_CALLBACK_MISSING as it always did.
const SCRIPT_OPTIONS = vm.constants && vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER
  ? { importModuleDynamically: vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER }
  : {};

// Node warns once that this loader is experimental: a warning about the driver's machinery,
// not about the user's code, so it is not shown. Every other warning is.
const emitWarning = process.emitWarning;
process.emitWarning = function (warning, ...rest) {
  const text = typeof warning === 'string' ? warning : String(warning && warning.message);
  if (text.includes('USE_MAIN_CONTEXT_DEFAULT_LOADER')) return undefined;
  return emitWarning.call(this, warning, ...rest);
};

let topLevelAwait; // node's REPL transform, loaded on the first script that needs it

function rewriteTopLevelAwait(source) {
  if (topLevelAwait === undefined) {
    try {
      topLevelAwait = require('internal/repl/await').processTopLevelAwait;
    } catch {
      topLevelAwait = null; // node without --expose-internals, or without the module
    }
  }
  if (topLevelAwait === null || !source.includes('await')) return null;
  try {
    // The newline ends a line comment on the last line before the wrapper's closing brace.
    return topLevelAwait(source + '\n');
  } catch {
    return null; // not valid as an async function's body either
  }
}

// A request's script, and whether it was rewritten for top-level await (its promise then
// resolves to { value } or undefined). Code that compiles as it is runs as it is.
function compileRequest(source, seq) {
  const options = { filename: `<repl-${seq}>`, displayErrors: true, ...SCRIPT_OPTIONS };
  try {
    return { script: new vm.Script(source, options), awaits: false };
  } catch (err) {
    const rewritten = err instanceof SyntaxError ? rewriteTopLevelAwait(source) : null;
    if (rewritten === null) throw err;
    return { script: new vm.Script(rewritten, options), awaits: true };
  }
}

// --- Errors.

function isInterrupt(err) {
  return err !== null && typeof err === 'object' && err.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED';
}

function formatError(err) {
  if (err === null || typeof err !== 'object' || typeof err.stack !== 'string') {
    return 'Uncaught ' + util.inspect(err) + '\n';
  }
  // Frames of the driver and of vm come after the user's: cut from the first of them.
  const lines = err.stack.split('\n');
  const isDriverFrame = (line) => /^\s+at /.test(line)
    && (line.includes(DRIVER_FILE) || /node:(internal\/)?vm/.test(line));
  const cut = lines.findIndex(isDriverFrame);
  const kept = cut < 0 ? lines : lines.slice(0, cut);
  return kept.join('\n') + '\n';
}

function report(text) {
  writeAllSync(2, text);
}

// --- Interrupts.
//
// Only a SIGINT breaks a running script (vm's breakOnSigint), and it must never land outside
// the script it is meant for. One landing just after breakOnSigint ended kills node: node's
// watchdog sets SIGINT's handler to "exit" when it stops, and vm gives SIGINT back to the
// process's listeners only a moment later. So the host never sends one. It writes the number
// of the request to interrupt on fd 4, and a thread of ours (the interrupter, a Worker: the
// main thread is busy running the script) sends the SIGINT, but only while the main thread
// is inside that request's script, as they agree through `interruptState`:
//   [0]  what the main thread does: tag(seq) | SCRIPT, STOPPING, AWAITING, or IDLE
//   [1]  tag(seq) of the last request the host asked to interrupt
// The interrupter moves SCRIPT to STOPPING (compare-and-swap) and only then sends SIGINT; the
// main thread leaves SCRIPT for IDLE by the same compare-and-swap before its script ends, and
// if it finds STOPPING it waits, still inside the script, for the SIGINT to break it. So a
// SIGINT is sent only when it will break the script it was meant for. The script that runs
// under breakOnSigint is the driver's `runner`, which runs the user's script and then leaves
// SCRIPT: the leaving happens inside it. An interrupt that comes while the driver awaits the
// request's promise abandons the await (a message from the interrupter); one for any other
// request is dropped.

const IDLE = 0;
const SCRIPT = 1;
const STOPPING = 2;
const AWAITING = 3;
const interruptState = new Int32Array(new SharedArrayBuffer(8));
// How long the main thread waits for a SIGINT the interrupter has sent. It comes in
// microseconds, unless user code took SIGINT from node's watchdog (process.on('SIGINT')).
const SIGINT_WAIT_MS = 1000;

// seq as a positive multiple of 4 in an Int32, so that a phase can be or-ed in.
function tag(seq) {
  return ((seq - 1) % 0x1fffffff + 1) * 4;
}

const INTERRUPTER = `'use strict';
const { workerData, parentPort } = require('worker_threads');
const net = require('net');
const state = new Int32Array(workerData.state);
${tag.toString()}
function interrupt(seq) {
  const t = tag(seq);
  Atomics.store(state, 1, t);
  if (Atomics.compareExchange(state, 0, t | ${SCRIPT}, t | ${STOPPING}) === (t | ${SCRIPT})) {
    process.kill(process.pid, 'SIGINT');
  } else if (Atomics.load(state, 0) === (t | ${AWAITING})) {
    parentPort.postMessage(seq);
  }
}
let rest = '';
const input = new net.Socket({ fd: workerData.fd, readable: true, writable: false });
input.setEncoding('latin1');
input.on('data', (chunk) => {
  const lines = (rest + chunk).split('\\n');
  rest = lines.pop();
  for (const line of lines) {
    const seq = Number(line);
    if (Number.isSafeInteger(seq) && seq > 0) interrupt(seq);
  }
});
input.on('error', () => {});
`;

function startInterrupter() {
  let fd;
  try {
    // A copy that is close-on-exec (every fd node opens is), so that no child of user code
    // inherits the interrupt pipe, even one started before the interrupter runs.
    fd = fs.openSync(`/proc/self/fd/${INTERRUPT_FD}`, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
    fs.closeSync(INTERRUPT_FD);
  } catch (err) {
    fd = INTERRUPT_FD; // no /proc, or no fd 4 (then the Worker fails, and nothing is lost)
  }
  const worker = new Worker(INTERRUPTER, {
    eval: true, workerData: { state: interruptState.buffer, fd }, stdout: false, stderr: false,
  });
  worker.on('message', (seq) => {
    if (abandonAwait) abandonAwait(seq);
  });
  worker.on('error', () => {}); // only SIGINTs from elsewhere interrupt then
  worker.unref();
}

// The request whose script the runner runs.
let running = null;
const CUT_SHORT = Symbol('interrupted by the driver');
Object.defineProperty(globalThis, '__toolsdRunRequest', { value: runRunning });
const runner = new vm.Script('__toolsdRunRequest()', { filename: DRIVER_FILE });

function runRunning() {
  const t = tag(running.seq);
  Atomics.store(interruptState, 0, t | SCRIPT);
  if (Atomics.load(interruptState, 1) === t) {
    leaveScript(t);
    throw CUT_SHORT;
  }
  try {
    return running.script.runInContext(running.context, { displayErrors: false });
  } finally {
    leaveScript(t); // not reached when a SIGINT broke the script: nothing is left to wait for
  }
}

function leaveScript(t) {
  if (Atomics.compareExchange(interruptState, 0, t | SCRIPT, IDLE) === (t | SCRIPT)) return;
  Atomics.wait(interruptState, 0, t | STOPPING, SIGINT_WAIT_MS); // the SIGINT ends this wait
  Atomics.store(interruptState, 0, IDLE);
  throw CUT_SHORT;
}

function runScript(context, seq, script) {
  running = { context, seq, script };
  try {
    return runner.runInThisContext({ breakOnSigint: true, displayErrors: false });
  } finally {
    running = null;
    Atomics.store(interruptState, 0, IDLE);
  }
}

// Having a SIGINT listener at all is what keeps the default action (exit) away while idle.
process.on('SIGINT', () => {});
let abandonAwait = null;

process.on('uncaughtException', (err) => {
  report('Uncaught exception (from a callback): ' + formatError(err));
});
process.on('unhandledRejection', (reason) => {
  report('Unhandled promise rejection: ' + formatError(reason));
});

const INTERRUPTED = Symbol('interrupted');

function awaitOrInterrupt(promise, seq) {
  return new Promise((resolve, reject) => {
    const t = tag(seq);
    abandonAwait = (asked) => {
      if (asked === seq) resolve(INTERRUPTED);
    };
    Atomics.store(interruptState, 0, t | AWAITING);
    if (Atomics.load(interruptState, 1) === t) resolve(INTERRUPTED);
    promise.then(resolve, reject);
  }).finally(() => {
    abandonAwait = null;
    Atomics.store(interruptState, 0, IDLE);
  });
}

// Let callbacks the code queued without delay (nextTick, resolved promises, immediates) print
// before the sentinel.
function settle() {
  return new Promise((resolve) => setImmediate(resolve));
}

async function runRequest(context, seq, source) {
  let value;
  try {
    const { script, awaits } = compileRequest(source, seq);
    value = runScript(context, seq, script);
    if (util.types.isPromise(value)) {
      value = await awaitOrInterrupt(value, seq);
      if (value === INTERRUPTED) {
        await settle();
        report('Interrupted while awaiting a promise (it may still be running).\n');
        return 'interrupted';
      }
      if (awaits) value = value === undefined ? undefined : value.value;
    }
    context._ = value;
    await settle();
    // Inside the try: a custom inspect or a Proxy may throw.
    if (value !== undefined) writeAllSync(1, util.inspect(value) + '\n');
    return 'ok';
  } catch (err) {
    await settle();
    if (isInterrupt(err) || err === CUT_SHORT) {
      report('Interrupted: script execution was stopped.\n');
      return 'interrupted';
    }
    report(formatError(err));
    return 'error';
  }
}

async function main() {
  startInterrupter();
  // libuv opens the fd as a pipe handle and marks it close-on-exec, so children of user code
  // never inherit the command pipe (node has no fcntl to do it by hand).
  const input = new net.Socket({ fd: COMMAND_FD, readable: true, writable: false });
  const lines = readline.createInterface({ input, crlfDelay: Infinity });
  let head = null;
  let context = null;
  let seq = 0;
  for await (const line of lines) {
    if (head === null) {
      head = MARKER_PREFIX + line.trim() + ':';
      context = makeContext();
      continue;
    }
    seq += 1;
    let source;
    try {
      source = JSON.parse(line);
      if (typeof source !== 'string') throw new Error('not a string');
    } catch (err) {
      report(`toolsd driver: request ${seq} is not a JSON string (${err.message}).\n`);
      writeAllSync(1, head + seq + ':' + JSON.stringify({ status: 'error' }) + '\n');
      continue;
    }
    const status = await runRequest(context, seq, source);
    writeAllSync(1, head + seq + ':' + JSON.stringify({ status }) + '\n');
  }
  // End of the command pipe: timers or servers the user left must not keep the driver alive.
  process.exit(0);
}

main().catch((err) => {
  report('toolsd driver failed: ' + formatError(err));
  process.exit(70);
});
