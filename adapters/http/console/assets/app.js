// iop web console. A client of the edge's public HTTP API only (/v1/…),
// served from the same origin. No framework, no build step: plain DOM.
'use strict';

// ---------------------------------------------------------------- helpers

// h builds an element. Text is always set as text, never parsed as HTML:
// node ids, run output and event data come from outside.
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'value') el.value = v;
    else if (k === 'style') el.style.cssText = v; // CSSOM: allowed by the page's CSP, unlike a style attribute
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const SVGNS = 'http://www.w3.org/2000/svg';
function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const c of children.flat()) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

function fmtTime(t) {
  if (!t) return '—';
  const d = new Date(t);
  if (isNaN(d)) return '—';
  return d.toLocaleString(undefined, { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit', second: '2-digit' });
}

function ago(t) {
  if (!t) return '';
  const sec = Math.max(0, (Date.now() - new Date(t).getTime()) / 1000);
  if (sec < 60) return Math.floor(sec) + 's ago';
  if (sec < 3600) return Math.floor(sec / 60) + 'm ago';
  if (sec < 86400) return Math.floor(sec / 3600) + 'h ' + Math.floor((sec % 3600) / 60) + 'm ago';
  return Math.floor(sec / 86400) + 'd ago';
}

function dur(a, b) {
  if (!a || !b) return '';
  const ms = new Date(b) - new Date(a);
  if (ms < 1000) return ms + ' ms';
  // Tenths of a second up to 59.9 s: from 59,950 ms on, toFixed(1) says
  // "60.0 s". Longer ones are rounded to whole seconds before they are
  // split, or 119.6 s would be "1m 60s".
  if (ms < 59950) return (ms / 1000).toFixed(1) + ' s';
  const sec = Math.round(ms / 1000);
  return Math.floor(sec / 60) + 'm ' + (sec % 60) + 's';
}

function num(n) {
  if (n === undefined || n === null) return '—';
  return Number(n).toLocaleString();
}

// cost formats a cost in USD: three decimals from a cent up, three
// significant digits below (a cheap run's $0.0000012 is not "$0.00000").
function cost(c) {
  c = Number(c);
  if (!(c > 0)) return '';
  return '$' + c.toFixed(c >= 0.01 ? 3 : Math.min(20, 2 - Math.floor(Math.log10(c))));
}

// chartCost is a chart's cost label: cents from a dollar up, cost() below
// (a range's $0.0004 drew every gridline "$0.000").
function chartCost(v) {
  return v >= 1 ? '$' + v.toFixed(2) : cost(v) || '$0';
}

function badge(text) {
  return h('span', { class: 'badge ' + text }, text);
}

const FINISHED = new Set(['succeeded', 'failed', 'cancelled']);
const TERMINAL = new Set(['complete', 'error', 'cancelled']);

function statusOfTerminal(type) {
  return { complete: 'succeeded', error: 'failed', cancelled: 'cancelled' }[type] || 'running';
}

// ---------------------------------------------------------------- API access

const KEY = 'iop.console.key';
const FORBIDDEN = 'iop.console.forbidden';

class ApiError extends Error {
  constructor(status, code, message) {
    super(message || code || ('HTTP ' + status));
    this.status = status;
    this.code = code;
  }
}

// Actions a key's scopes may forbid. The API has no route that lists a key's
// scopes, so the console learns them from 403 answers: probeScopes asks up
// front with requests that can never do anything, and any later 403 hides
// its action too, for the rest of the tab's session or until the key
// changes.
function forbidden() {
  try { return new Set(JSON.parse(sessionStorage.getItem(FORBIDDEN) || '[]')); } catch { return new Set(); }
}
function markForbidden(action) {
  if (!action) return;
  const f = forbidden();
  if (f.has(action)) return;
  f.add(action);
  sessionStorage.setItem(FORBIDDEN, JSON.stringify([...f]));
  applyForbidden();
}
function allowed(action) { return !forbidden().has(action); }
function applyForbidden() {
  const f = forbidden();
  for (const el of document.querySelectorAll('[data-needs]')) el.hidden = f.has(el.dataset.needs);
}

let keyPrompt = null;
// keyDismissed is set when the key dialog was closed without a key
// (Escape): requests that meet a 401 then fail at once, saying a key is
// needed, instead of waiting on a dialog that is gone, until the header's
// "Enter key" opens it again.
let keyDismissed = false;

// KEY_OK is what an API key may hold: printable ASCII, no spaces. Anything
// else (a smart quote pasted with it) cannot go in an HTTP header: the
// browser's Headers refuses it with a TypeError on every request.
const KEY_OK = /^[\x21-\x7e]+$/;

// scopeRefusal tells the edge's refusal for a key without a route's scope
// (adapters/http auth: 403 forbidden, `API key "NAME" lacks the "SCOPE"
// scope needed for …`) from its other 403s, which say nothing of the key's
// scopes: a session another key owns, a key limited to some nodes.
function scopeRefusal(status, code, message) {
  return status === 403 && (!code || code === 'forbidden') && /lacks the "[^"]*" scope/.test(message || '');
}

// probeScopes sends, with the key, one request per guarded action whose body
// is not JSON: the edge checks the key's scope before it reads a body, so
// its scope refusal means the scope is missing, and anything else (400)
// that it is there. Nothing is started or changed either way.
async function probeScopes() {
  const key = sessionStorage.getItem(KEY);
  if (!key || !KEY_OK.test(key)) return;
  const probes = [
    { path: '/v1/runs', actions: ['runs.start', 'runs.cancel'] },
    { path: '/v1/nodes/-/commands', actions: ['nodes.command'] },
  ];
  await Promise.all(probes.map(async (p) => {
    try {
      const resp = await fetch(p.path, { method: 'POST', headers: { Authorization: 'Bearer ' + key, 'Content-Type': 'application/json' }, body: 'probe', cache: 'no-store', signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) });
      // The answer is the old key's if another was entered meanwhile.
      if (resp.status !== 403 || sessionStorage.getItem(KEY) !== key) return;
      let e = {};
      try { e = (await resp.json()).error || {}; } catch { /* not JSON */ }
      if (scopeRefusal(resp.status, e.code, e.message)) p.actions.forEach(markForbidden);
    } catch { /* the edge is unreachable: later requests say so */ }
  }));
}

// askKey shows the key dialog once, however many requests are waiting. It
// resolves once a key is entered, and rejects if the dialog is closed
// without one (Escape: a dialog the page opened by itself, without a click,
// may not refuse to close), or at once after such a close until the
// header's "Enter key" (askKey with force) opens it again.
function askKey(reason, force) {
  if (keyPrompt) return keyPrompt;
  if (keyDismissed && !force) return Promise.reject(keyNeeded());
  keyDismissed = false;
  renderKeyState();
  const p = new Promise((resolve, reject) => {
    const dlg = document.getElementById('key-dialog');
    const input = document.getElementById('key-input');
    const bad = document.getElementById('key-error');
    document.getElementById('key-reason').textContent = reason;
    input.value = '';
    bad.textContent = '';
    const form = document.getElementById('key-form');
    let entered = false;
    const done = (ev) => {
      ev.preventDefault();
      const k = input.value.trim();
      if (!k) return;
      if (!KEY_OK.test(k)) {
        bad.textContent = 'That key holds characters an API key cannot have (spaces, quotes such as “ ” or ‘ ’, or other non-ASCII): paste the key itself.';
        input.focus();
        return;
      }
      entered = true;
      cleanup();
      sessionStorage.setItem(KEY, k);
      sessionStorage.removeItem(FORBIDDEN);
      applyForbidden();
      dlg.close();
      renderKeyState();
      probeScopes().then(() => {
        keyPrompt = null;
        resolve();
        restartBus();
      });
    };
    const closed = () => {
      if (entered) return;
      cleanup();
      keyPrompt = null;
      keyDismissed = true;
      renderKeyState();
      reject(keyNeeded());
    };
    const cancel = (ev) => ev.preventDefault();
    function cleanup() {
      form.removeEventListener('submit', done);
      dlg.removeEventListener('close', closed);
      dlg.removeEventListener('cancel', cancel);
    }
    form.addEventListener('submit', done);
    dlg.addEventListener('close', closed);
    dlg.addEventListener('cancel', cancel);
    dlg.showModal();
    input.focus();
  });
  keyPrompt = p;
  return p;
}

function keyNeeded() {
  return new ApiError(401, 'unauthorized', 'this edge asks for an API key and none was entered: use "Enter key" at the top of the page');
}

// enterKey opens the key dialog from the header's button; once a key is
// entered the page is drawn again with it (its requests failed meanwhile).
function enterKey() {
  askKey('This edge asks for an API key.', true).then(() => route(), () => {});
}

function renderKeyState() {
  const el = document.getElementById('key-state');
  el.replaceChildren();
  if (!sessionStorage.getItem(KEY)) {
    if (keyDismissed) {
      el.append(h('span', { id: 'key-needed', class: 'key-needed' }, 'API key needed'),
        h('button', { class: 'small', id: 'key-enter', onclick: enterKey }, 'Enter key'));
    }
    return;
  }
  el.append('key set', h('button', {
    class: 'small', title: 'forget the key kept in this tab', onclick: () => {
      sessionStorage.removeItem(KEY);
      sessionStorage.removeItem(FORBIDDEN);
      location.reload();
    },
  }, 'forget'));
}

// REQUEST_TIMEOUT_MS bounds a request to the edge, from sending it to the
// last byte of its answer: an edge (or a proxy before it) that holds a
// request without answering otherwise leaves a page waiting for good with
// nothing said. STREAM_HEADERS_MS bounds a stream's wait for its headers
// only (the event feed, a run streaming on Start a run): the edge admits a
// run within 30 s (AdmitTimeout in application/edge/submit_run.go), and
// once the stream is open, readSSE's idle limit watches it. The tests
// shorten both through session storage, read once when the page loads.
const REQUEST_TIMEOUT_MS = Number(sessionStorage.getItem('iop.console.requestTimeoutMs')) || 30000;
const STREAM_HEADERS_MS = Number(sessionStorage.getItem('iop.console.streamHeadersMs')) || 60000;

// api sends one request to the edge. A 401 asks for a key and retries (or
// fails, saying a key is needed, once the dialog was closed without one); a
// 403 that is the edge's scope refusal marks the action forbidden; any
// other failure throws an ApiError carrying the API's
// {"error":{"code","message"}}. An answer to a request sent with a key that
// is no longer the tab's (another was entered while it was on its way) says
// nothing about the new key: a refusal (401, a scope's 403) or a read is
// sent again with the new key, and the refusal neither drops the new key
// nor hides an action. With opts.stream,
// the answer's body is left to the caller to read for as long as it lasts;
// otherwise it is read here, within the deadline, and a Response holding
// it is returned. A request that times out throws ApiError 'timeout'.
async function api(path, opts = {}) {
  const method = opts.method || 'GET';
  for (;;) {
    const key = sessionStorage.getItem(KEY);
    let headers, body;
    try {
      headers = new Headers(opts.headers || {});
      if (key) headers.set('Authorization', 'Bearer ' + key);
      if (opts.json !== undefined) {
        headers.set('Content-Type', 'application/json');
        body = JSON.stringify(opts.json);
      }
    } catch (err) {
      // A key kept from before keys were checked (or set by hand) that
      // cannot go in a header: taken as refused, and asked for again.
      if (!(err instanceof TypeError) || !key) throw err;
      sessionStorage.removeItem(KEY);
      await askKey('The key kept in this tab cannot be sent (it holds characters an API key cannot have, such as smart quotes). Enter it again.');
      continue;
    }
    const ms = opts.stream ? STREAM_HEADERS_MS : REQUEST_TIMEOUT_MS;
    // The request ends at the deadline or with the caller's signal (by
    // hand: AbortSignal.any is newer than browsers still in use).
    const ctl = new AbortController();
    const onAbort = () => ctl.abort();
    if (opts.signal) {
      if (opts.signal.aborted) ctl.abort();
      else opts.signal.addEventListener('abort', onAbort, { once: true });
    }
    let timedOut = false;
    const timer = setTimeout(() => { timedOut = true; ctl.abort(); }, ms);
    let resp, buffered;
    try {
      resp = await fetch(path, { method, headers, body, signal: ctl.signal, cache: 'no-store' });
      // A stream's deadline ends with its headers; a refusal's body, as
      // any other answer's, is read within it.
      if (!opts.stream || !resp.ok) buffered = await resp.arrayBuffer();
    } catch (err) {
      if (timedOut) throw new ApiError(0, 'timeout', `the edge did not answer ${method} ${path.split('?')[0]} within ${Math.round(ms / 1000)} s`);
      throw err;
    } finally {
      clearTimeout(timer);
      if (opts.signal && buffered !== undefined) opts.signal.removeEventListener('abort', onAbort);
    }
    const stale = key !== sessionStorage.getItem(KEY);
    if (resp.status === 401) {
      if (stale) continue;
      if (key) sessionStorage.removeItem(KEY);
      await askKey(key ? 'The edge refused that key. Enter another one.' : 'This edge asks for an API key.');
      continue;
    }
    if (resp.ok) {
      // A read made with the old key shows what that key may see, which
      // the new one may not (a key limited to some nodes): it is made again.
      if (stale && method === 'GET' && !opts.stream) continue;
      if (opts.stream) return resp;
      // A 204 or 205 may carry no body, not even an empty one.
      return new Response(resp.status === 204 || resp.status === 205 ? null : buffered, { status: resp.status, statusText: resp.statusText, headers: resp.headers });
    }
    let code = '', message = '';
    try {
      const e = JSON.parse(new TextDecoder().decode(buffered)).error || {};
      code = e.code || '';
      message = e.message || '';
    } catch { /* not JSON */ }
    const scope = scopeRefusal(resp.status, code, message);
    if (scope && stale) continue;
    if (scope) markForbidden(opts.action);
    if (resp.status === 429 && !message) message = 'too many requests; try again in ' + (resp.headers.get('Retry-After') || 'a few') + ' s';
    const err = new ApiError(resp.status, code, message);
    err.scope = scope;
    throw err;
  }
}

async function apiJSON(path, opts) {
  return (await api(path, opts)).json();
}

// SSE_IDLE_MS is how long an event feed may stay silent before the page
// takes its connection for dead: four of the edge's keep-alives, sent every
// 15 s (DefaultKeepAlive in adapters/http/server.go). A connection that
// died without a FIN or RST (a sleeping laptop, a NAT that forgot it)
// otherwise leaves the feed "live" and silent for good. The tests shorten
// it through session storage, read once when the page loads.
const SSE_IDLE_MS = Number(sessionStorage.getItem('iop.console.sseIdleMs')) || 60000;

// NODES_POLL_MS is how often the Nodes page reads the nodes again (their
// RTT, "connected since … ago"); tests lengthen it to see what the feed
// alone makes it do.
const NODES_POLL_MS = Number(sessionStorage.getItem('iop.console.nodesPollMs')) || 5000;

// IdleError is thrown by readSSE when no byte came for SSE_IDLE_MS.
class IdleError extends Error {
  constructor(ms) {
    super(`no data from the edge for ${Math.round(ms / 1000)} s (it sends a keep-alive every 15 s): the connection is taken for dead`);
    this.name = 'IdleError';
  }
}

// readSSE reads a text/event-stream body (from fetch, so it can carry the
// Authorization header, which EventSource cannot) and calls onEvent(type,
// data) per event and onComment(text) per comment line (": keep-alive",
// ": dropped N events") until the stream ends or the signal aborts. With
// opts.idleMs, a stream silent that long is cancelled and IdleError thrown;
// every chunk read, keep-alives included, restarts the wait. A timer that
// fires a second or more past its time tells of a tab the browser froze or
// throttled meanwhile, whose data may be queued behind the timer: once per
// silence, it gets 2 s more to be read before the stream is taken for dead.
async function readSSE(resp, onEvent, opts = {}) {
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = '', type = '', data = [];
  let idle = false, timer = null, graced = false;
  const arm = (ms) => {
    if (!opts.idleMs) return;
    clearTimeout(timer);
    const due = performance.now() + ms;
    timer = setTimeout(() => {
      if (!graced && performance.now() - due > 1000) {
        graced = true;
        arm(2000);
        return;
      }
      idle = true;
      reader.cancel().catch(() => {}); // ends the pending read and closes the connection
    }, ms);
  };
  arm(opts.idleMs);
  try {
    for (;;) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (err) {
        if (idle) throw new IdleError(opts.idleMs);
        throw err;
      }
      if (idle) throw new IdleError(opts.idleMs);
      if (chunk.done) return;
      graced = false;
      arm(opts.idleMs);
      buf += dec.decode(chunk.value, { stream: true });
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        let line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (line.endsWith('\r')) line = line.slice(0, -1);
        if (line === '') {
          if (data.length) onEvent(type || 'message', data.join('\n'));
          type = '';
          data = [];
        } else if (line.startsWith(':')) {
          if (opts.onComment) opts.onComment(line.slice(1).trim());
        } else if (line.startsWith('event:')) {
          type = line.slice(6).trim();
        } else if (line.startsWith('data:')) {
          let d = line.slice(5);
          if (d.startsWith(' ')) d = d.slice(1);
          data.push(d);
        }
      }
    }
  } finally {
    clearTimeout(timer);
  }
}

function showError(where, err) {
  where.replaceChildren(h('div', { class: 'error-box' }, err.code ? `${err.code}: ${err.message}` : String(err.message || err)));
}

// ---------------------------------------------------------------- live state

// runs holds what this tab has seen of runs on the bus, newest last,
// bounded so a long-open tab does not grow without end. A run's output (and
// reasoning) keeps its last MAX_OUTPUT characters and its events list the
// last MAX_EVENTS_PER_RUN, on a run's page and on Start a run alike: the end
// is where an answer ends. What was cut is counted, and the page says so.
// Both are cut back only once they pass their bound by a quarter, so that a
// run of many small deltas is not copied whole at each one.
const MAX_RUNS = 300, MAX_EVENTS_PER_RUN = 4000, MAX_OUTPUT = 1 << 20;

// EVENT_SHOWN is how much of an event's data (as JSON) its row in a run's
// events list shows.
const EVENT_SHOWN = 300;

// eventRow is what a run's events list keeps of an event: its seq, type and
// the start of its data, as its row shows them. Not the event itself: a
// delta's text (up to 32 KiB for an exec target's read) kept in each of the
// last MAX_EVENTS_PER_RUN events held up to 160 MiB of a run whose output is
// cut to MAX_OUTPUT.
function eventRow(ev) {
  const rest = { ...ev };
  for (const k of ['run_id', 'node', 'seq', 'type']) delete rest[k];
  // The JSON of a longer text is past EVENT_SHOWN anyway: not copied whole.
  if (typeof rest.text === 'string' && rest.text.length > EVENT_SHOWN) rest.text = rest.text.slice(0, EVENT_SHOWN);
  let d = JSON.stringify(rest);
  if (d.length > EVENT_SHOWN) d = d.slice(0, EVENT_SHOWN) + '…';
  return { seq: ev.seq, type: ev.type, data: d === '{}' ? '' : d };
}

// foldEvent adds one event to a run's view state (events, output,
// reasoning, usage, error), keeping each within its bound.
function foldEvent(st, ev) {
  st.events.push(eventRow(ev));
  st.eventsTotal = (st.eventsTotal || 0) + 1;
  if (st.events.length > MAX_EVENTS_PER_RUN + (MAX_EVENTS_PER_RUN >> 2)) {
    const n = st.events.length - MAX_EVENTS_PER_RUN;
    st.events.splice(0, n);
    st.eventsCut = (st.eventsCut || 0) + n;
  }
  if (ev.type === 'delta') appendBounded(st, 'output', ev.text);
  if (ev.type === 'reasoning_delta') appendBounded(st, 'reasoning', ev.text);
  if (ev.usage) st.usage = ev.usage;
  if (ev.error) st.error = ev.error;
}

function appendBounded(st, field, text) {
  if (!text) return;
  st[field] += text;
  if (st[field].length > MAX_OUTPUT + (MAX_OUTPUT >> 2)) {
    const n = st[field].length - MAX_OUTPUT;
    st[field] = st[field].slice(n);
    st[field + 'Cut'] = (st[field + 'Cut'] || 0) + n;
  }
}
const runs = new Map();
const busListeners = new Set();
const seenNodes = new Map(); // id → {disconnectedAt, last view}

// online tells a connected node of GET /v1/nodes from an offline node of the
// edge's config ("connected": false); an edge without the field lists
// connected nodes only.
const online = (n) => n.connected !== false;

function runState(id, node) {
  let r = runs.get(id);
  if (!r) {
    r = { run_id: id, node, status: 'running', events: [], lastSeq: 0, output: '', reasoning: '', usage: null, error: null, seenAt: new Date().toISOString() };
    runs.set(id, r);
    if (runs.size > MAX_RUNS) dropRun();
  }
  if (node && !r.node) r.node = node;
  return r;
}

// pinned counts, per run id, what shows a run from its state: its page, a
// run followed on Start a run after its stream died. dropRun lets none of
// them go.
const pinned = new Map();
function pinRun(id) {
  pinned.set(id, (pinned.get(id) || 0) + 1);
  let done = false;
  return () => {
    if (done) return;
    done = true;
    const n = pinned.get(id) - 1;
    if (n > 0) pinned.set(id, n);
    else pinned.delete(id);
  };
}

// dropRun makes room in runs for one more: the oldest run that ended goes,
// or with none ended the oldest still going; never one pinned or one this
// tab streams itself. Dropped, a run still going started over empty with
// its next event, and a page open on it showed only what came after.
function dropRun() {
  let victim;
  for (const [id, r] of runs) {
    if (pinned.has(id) || r.ownStream) continue;
    if (FINISHED.has(r.status)) {
      victim = id;
      break;
    }
    if (victim === undefined) victim = id;
  }
  if (victim !== undefined) runs.delete(victim);
}

// applyRunEvent folds one run event into its run's state. A run started
// from this tab comes twice, from its POST stream and from the bus: a seq
// at or below the last one folded is a copy. (The events list cannot tell:
// it keeps only the last MAX_EVENTS_PER_RUN.) A run's seqs go up by one
// from 1, and each feed is in order.
function applyRunEvent(ev) {
  if (!ev || !ev.run_id) return null;
  const r = runState(ev.run_id, ev.node);
  if (ev.seq) {
    if (ev.seq <= r.lastSeq) return r;
    r.lastSeq = ev.seq;
  }
  foldEvent(r, ev);
  if (ev.type === 'start') {
    r.started = true;
    const m = ev.metadata && typeof ev.metadata === 'object' ? ev.metadata : {};
    r.adapter = r.adapter || m.adapter;
    r.target = r.target || m.target;
  }
  if (TERMINAL.has(ev.type)) {
    r.status = statusOfTerminal(ev.type);
    r.finishedAt = new Date().toISOString();
  }
  return r;
}

// stashRunEvent keeps aside the bus's copy of an event of a run that its
// own stream follows (Start a run), if the stream has not given it yet: the
// stream may die before the run ends (a dead connection, taken for dead
// after SSE_IDLE_MS), and what the bus saw meanwhile is then folded in by
// releaseRun. Copies the stream has since given are pruned as more come, so
// the stash holds about how far the bus is ahead.
function stashRunEvent(r, ev) {
  if (!ev.seq || ev.seq <= r.lastSeq) return;
  const s = r.stash || (r.stash = []);
  while (s.length && s[0].seq <= r.lastSeq) s.shift();
  if (s.length < MAX_EVENTS_PER_RUN) s.push(ev);
}

// releaseRun ends a run's own stream's hold on its state: the bus follows
// the run from here, starting with the copies it stashed meanwhile, and the
// pages hear of the run again.
function releaseRun(r) {
  r.ownStream = false;
  const s = r.stash || [];
  r.stash = null;
  for (const ev of s) applyRunEvent(ev);
  if (s.length) notifyBus('run.event', { type: 'run.event', node: r.node, run: s[s.length - 1], local: true });
}

let busCtl = null, busRunning = false, busWake = null;

function notifyBus(type, ev) {
  for (const l of busListeners) {
    try { l(type, ev); } catch (e) { console.error(e); }
  }
}

// settleRuns asks the edge about the runs this tab holds as unfinished, the
// newest first, and takes the end of those that ended: after the bus lost
// events (a reconnect, a "dropped N events" comment) their terminal events
// may be among the lost, and the Runs page would show them in flight for
// good.
async function settleRuns() {
  const open = [...runs.values()].filter((r) => !FINISHED.has(r.status)).reverse().slice(0, 50);
  await Promise.all(open.map(async (r) => {
    try {
      const rec = await apiJSON('/v1/runs/' + encodeURIComponent(r.run_id), { action: 'runs.read' });
      settleRun(r, rec);
    } catch { /* unknown to the edge, or unreachable: left as it is */ }
  }));
}

// settleRun takes a run's end from the edge's record of it when this tab
// missed its terminal event.
function settleRun(st, rec) {
  if (!st || !rec || !FINISHED.has(rec.status) || FINISHED.has(st.status)) return;
  st.status = rec.status;
  st.finishedAt = rec.finished_at || new Date().toISOString();
  if (rec.error && !st.error) st.error = rec.error;
  if (rec.usage && !st.usage) st.usage = rec.usage;
}

// resyncBus follows a gap in the bus: the runs the tab holds as unfinished
// are settled, then the pages hear "bus.resync" and reload what they show.
// Gaps reported while one is being followed (an edge under load may report
// drops again and again) make one more round, not one each.
let resyncing = false, resyncAgain = false;
async function resyncBus() {
  if (resyncing) {
    resyncAgain = true;
    return;
  }
  resyncing = true;
  try {
    do {
      resyncAgain = false;
      await settleRuns();
      notifyBus('bus.resync', {});
    } while (resyncAgain);
  } finally {
    resyncing = false;
  }
}

// busState is where the tab's feed is, for the header and the Events page:
// phase 'connecting', 'live', 'retry' (why, idle, due: when it tries
// again), 'hidden' (why, idle: waits for the tab to be shown) or 'refused'
// (err: a 401, 403 or another 4xx but 408 and 429 stops the retries).
// Pages hear each change as "bus.state".
let busState = { phase: 'connecting' };
let busBackoff = 1000;
function setBusState(st) {
  busState = st;
  const el = document.getElementById('bus-state');
  switch (st.phase) {
    case 'live': el.textContent = '● live'; el.className = 'live'; break;
    case 'connecting': break;
    case 'refused':
      el.textContent = st.err.status === 401 ? '○ offline (API key needed)'
        : st.err.status === 403 ? '○ no live feed (key lacks access)' : '○ no live feed (refused)';
      el.className = 'muted';
      break;
    default: el.textContent = '○ reconnecting'; el.className = 'muted';
  }
  notifyBus('bus.state', st);
}

// startBus keeps one connection to GET /v1/events for the whole tab: the
// pages, the Events page too, listen to it (a browser keeps at most six
// connections to one host over HTTP/1.1, and each feed holds one for good).
// A feed that ends, fails or stays silent for SSE_IDLE_MS is made again
// after a jittered backoff: 1 s, doubling up to 30 s, back to 1 s after a
// connection that stayed up 10 s; a tab that is hidden when the time comes
// waits until it is shown. A refused key (401, 403) or request (another
// 4xx but 408 and 429) stops it until restartBus.
async function startBus(force) {
  if (busRunning || (!force && !allowed('events'))) return;
  busRunning = true;
  // retried: a try failed before this connection. The pages' first reads
  // were made meanwhile, and may have failed as it did (an edge away,
  // restarting): they are made again once it connects.
  let connected = false, retried = false;
  try {
    for (;;) {
      const ctl = new AbortController();
      busCtl = ctl;
      let opened = 0, why = '', idle = false;
      setBusState({ phase: 'connecting' });
      try {
        const resp = await api('/v1/events', { signal: ctl.signal, stream: true, action: 'events', headers: { Accept: 'text/event-stream' } });
        opened = performance.now();
        setBusState({ phase: 'live' });
        // What happened while the bus was away is unknown.
        if (connected || retried) resyncBus();
        connected = true;
        await readSSE(resp, (type, data) => {
          let ev;
          try { ev = JSON.parse(data); } catch { return; }
          // A run this tab streams itself (Start a run) is folded from that
          // stream; the bus's copy only tells the pages to look again, and
          // is kept aside in case the stream dies (stashRunEvent).
          if (ev.run) {
            const r = runs.get(ev.run.run_id);
            if (r && r.ownStream) stashRunEvent(r, ev.run);
            else applyRunEvent(ev.run);
          }
          if (ev.node && type.startsWith('node.')) {
            const n = seenNodes.get(ev.node) || {};
            if (type === 'node.disconnected') {
              n.disconnectedAt = ev.time;
              n.reason = ev.reason || '';
            }
            if (type === 'node.registered') n.disconnectedAt = null;
            seenNodes.set(ev.node, n);
          }
          notifyBus(type, ev);
        }, {
          idleMs: SSE_IDLE_MS,
          // The edge dropped events this tab was too slow to take.
          onComment: (c) => { if (c.startsWith('dropped')) resyncBus(); },
        });
        why = 'The event stream ended.';
      } catch (err) {
        if (busCtl === ctl) {
          const st = err.status || 0;
          if (st >= 400 && st < 500 && st !== 408 && st !== 429) {
            setBusState({ phase: 'refused', err });
            return;
          }
          if (err instanceof IdleError) {
            why = `The event stream stopped: ${err.message}.`;
            idle = true;
          } else {
            why = `The event stream failed: ${err.code ? err.code + ': ' : ''}${err.message || err}.`;
          }
        }
      }
      ctl.abort(); // an idle connection's, or one whose read failed
      if (busCtl !== ctl) continue; // restarted: at once, without a wait
      retried = true;
      if (opened && performance.now() - opened >= 10000) busBackoff = 1000;
      const delay = Math.round(busBackoff / 2 + Math.random() * busBackoff / 2);
      busBackoff = Math.min(busBackoff * 2, 30000);
      setBusState({ phase: 'retry', why, idle, due: Date.now() + delay });
      let woken = false;
      await new Promise((r) => { busWake = () => { woken = true; r(); }; setTimeout(r, delay); });
      if (!woken && document.hidden) {
        setBusState({ phase: 'hidden', why, idle });
        await new Promise((r) => {
          const shown = () => {
            if (document.hidden && !woken) return;
            document.removeEventListener('visibilitychange', shown);
            r();
          };
          busWake = () => { woken = true; shown(); };
          document.addEventListener('visibilitychange', shown);
        });
      }
      busWake = null;
    }
  } finally {
    busRunning = false;
  }
}

// restartBus follows a key change: the feed is made again with the new key
// (whose scopes and node limits may differ), and a bus that stopped on the
// old key's refusal starts again.
function restartBus() {
  if (!busRunning) {
    startBus();
    return;
  }
  const old = busCtl;
  busCtl = null; // the loop reconnects at once, without its backoff
  if (old) old.abort();
  if (busWake) busWake();
}

// reconnectBus is the Events page's "Reconnect now": a try at once, the
// wait back to 1 s; a feed that was refused is asked again.
function reconnectBus() {
  busBackoff = 1000;
  if (!busRunning) {
    startBus(true);
    return;
  }
  if (busWake) busWake();
}

// ---------------------------------------------------------------- pages

const main = () => document.getElementById('main');
let pageCleanup = [];

function onCleanup(fn) { pageCleanup.push(fn); }
function listenBus(fn) { busListeners.add(fn); onCleanup(() => busListeners.delete(fn)); }
function every(ms, fn) { const t = setInterval(fn, ms); onCleanup(() => clearInterval(t)); }

// coalesce turns a burst of bus events into one call of fn, ms after the
// last of them. Events that keep coming closer than ms apart (a run
// streaming tokens, steady traffic) would put a plain debounce off for as
// long as they come, so the call is also made maxMs after the burst's first
// event. A call still running (fn's promise pending) is not started again
// over itself but followed by one more once it is done: a load slower than
// maxMs, restarted, would have its answer dropped for the newer one's,
// again and again, and draw nothing.
function coalesce(ms, maxMs, fn) {
  let timer = null, first = 0, running = false, again = false, left = false;
  onCleanup(() => { left = true; clearTimeout(timer); });
  const fire = async () => {
    timer = null;
    first = 0;
    if (running) {
      again = true;
      return;
    }
    running = true;
    try {
      await fn();
    } catch (err) {
      console.error(err);
    } finally {
      running = false;
    }
    if (again && !left) {
      again = false;
      call();
    }
  };
  const call = () => {
    if (left) return;
    const now = performance.now();
    if (!first) first = now;
    clearTimeout(timer);
    timer = setTimeout(fire, Math.max(0, Math.min(ms, first + maxMs - now)));
  };
  // now calls fn at once, as a page's first load does, under the same rule:
  // a page listens to the bus before its first load, and an event that
  // comes while that load runs (the load read the edge before it) is
  // followed by one more call, not lost.
  call.now = async () => {
    if (left) return;
    clearTimeout(timer);
    await fire();
  };
  return call;
}

// perFrame makes fn run once in the next animation frame however often it
// is asked before then: a redraw per frame, not per event, and none while
// the tab is hidden (the browser runs no frames then) until it is shown.
function perFrame(fn) {
  let frame = 0;
  onCleanup(() => { cancelAnimationFrame(frame); frame = -1; });
  return () => {
    if (frame) return;
    frame = requestAnimationFrame(() => {
      frame = 0;
      fn();
    });
  };
}

// ---- Nodes

const RTT_BATCH = 8;

async function pageNodes(root) {
  const list = h('div', { class: 'grid', id: 'nodes' });
  const status = h('div');
  root.append(h('h1', {}, 'Nodes'), status, list);
  const rtts = new Map();
  let lastNodes = [], rttBusy = false, left = false;
  onCleanup(() => { left = true; });

  // loadRTT asks every connected node for its heartbeat RTT, RTT_BATCH at
  // a time; a round still going when the next is due (many nodes, slow
  // answers) is not started again over itself.
  async function loadRTT(nodes) {
    if (!allowed('nodes.command') || rttBusy) return;
    rttBusy = true;
    try {
      for (let i = 0; i < nodes.length && !left; i += RTT_BATCH) {
        await Promise.all(nodes.slice(i, i + RTT_BATCH).map(async (n) => {
          try {
            const ts = await apiJSON(`/v1/nodes/${encodeURIComponent(n.id)}/commands`, { method: 'POST', json: { command: 'transport_status' }, action: 'nodes.command' });
            // 0 until the node has timed its first heartbeat.
            if (typeof ts.last_rtt_ms === 'number' && ts.last_rtt_ms > 0) rtts.set(n.id, ts.last_rtt_ms);
          } catch { /* an old node or a forbidden command: no RTT shown */ }
        }));
      }
    } finally {
      rttBusy = false;
    }
  }

  // Loads overlap (the first one, the bus's, the 5 s one): only the newest
  // draws the list.
  let loads = 0;
  async function load(withRTT) {
    const mine = ++loads;
    let data;
    try {
      data = await apiJSON('/v1/nodes', { action: 'nodes.read' });
    } catch (err) {
      if (mine === loads) showError(status, err);
      return;
    }
    if (mine !== loads) return;
    status.replaceChildren();
    lastNodes = data.nodes || [];
    for (const n of lastNodes.filter(online)) seenNodes.set(n.id, { ...(seenNodes.get(n.id) || {}), disconnectedAt: null, view: n });
    render();
    if (withRTT && !rttBusy) {
      await loadRTT(lastNodes.filter(online));
      if (!left) render();
    }
  }

  // render shows the connected nodes, then greyed: the config's offline
  // nodes the edge lists, and nodes seen here that the list no longer has
  // (an edge before offline nodes were listed, or a node dropped from the
  // config by a reload).
  function render() {
    const listed = new Set(lastNodes.map((n) => n.id));
    const gone = [...seenNodes.entries()].filter(([id, v]) => !listed.has(id) && v.view);
    const offline = (n) => {
      const seen = seenNodes.get(n.id) || {};
      return n.disconnected_at ? nodeCard(n, false, null, n.disconnected_at, n.disconnect_reason) : nodeCard(n, false, null, seen.disconnectedAt, seen.reason);
    };
    const cards = [
      ...lastNodes.filter(online).map((n) => nodeCard(n, true, rtts.get(n.id))),
      ...lastNodes.filter((n) => !online(n)).map(offline),
      ...gone.map(([, v]) => nodeCard(v.view, false, null, v.disconnectedAt, v.reason)),
    ];
    if (!cards.length) cards.push(h('p', { class: 'muted' }, 'No node is configured or connected.'));
    list.replaceChildren(...cards);
  }

  const refresh = coalesce(250, 2000, () => load(false));
  listenBus((type, ev) => {
    // A reload adds or removes nodes that are offline: no node.* event
    // says so.
    if (type === 'bus.resync' || type.startsWith('node.') || type === 'config.reloaded' || (type === 'run.event' && ev.run && (ev.run.type === 'start' || TERMINAL.has(ev.run.type)))) refresh();
  });
  await load(true);
  // RTT and "connected since … ago". Not for a page left while its first
  // load was on its way: the poll would go on reading the nodes for a page
  // no longer shown, under the next page's cleanup.
  if (!left) every(NODES_POLL_MS, () => load(true));
}

// nodeCard draws a node: connected (draining, if it is stopping), or
// offline since disconnectedAt, for reason (the edge's disconnect_reason, or
// the node.disconnected event's).
function nodeCard(n, connected, rtt, disconnectedAt, reason) {
  const adapters = (n.adapters || []).map((a) => {
    const max = a.max_concurrency || 0;
    const pct = max ? Math.min(100, (a.in_flight / max) * 100) : (a.in_flight ? 100 : 0);
    return h('div', { class: 'slots' },
      h('span', { class: 'mono', style: 'min-width:110px' }, a.name), h('span', { class: 'muted small' }, a.type),
      h('span', { class: 'bar' }, h('span', { style: `width:${pct}%` })),
      h('span', { class: 'small', 'data-slots': a.name }, `${connected ? a.in_flight : 0} / ${max || '∞'} slots`));
  });
  const providers = (n.providers || []).map((p) => h('div', {},
    h('span', { class: 'mono' }, p.name), ' ', h('span', { class: 'muted small' }, p.type), ' ',
    h('span', { class: 'models' }, (p.models || []).join(', ') || 'models discovered at run time')));
  return h('section', { class: 'panel node' + (connected ? '' : ' disconnected'), 'data-node': n.id },
    h('h3', {}, n.id, badge(connected ? 'connected' : 'disconnected'), connected && n.draining ? h('span', { class: 'badge draining', title: 'stopping: it takes no new run while those in flight end' }, 'draining') : null),
    h('dl', { class: 'kv' },
      connected
        ? [h('dt', {}, 'connected since'), h('dd', {}, fmtTime(n.connected_at), ' ', h('span', { class: 'muted small' }, '(' + ago(n.connected_at) + ')'))]
        : [h('dt', {}, 'disconnected'), h('dd', { 'data-disconnected': '' }, disconnectedAt ? fmtTime(disconnectedAt) + ' (' + ago(disconnectedAt) + ')' + (reason ? ': ' + reason : '') : 'not connected since the edge started')],
      h('dt', {}, 'heartbeat RTT'), h('dd', { 'data-rtt': '' }, connected && typeof rtt === 'number' ? rtt.toFixed(rtt < 1 ? 3 : 1) + ' ms' : '—'),
      h('dt', {}, 'version'), h('dd', {}, n.version || '—'),
      h('dt', {}, 'host'), h('dd', {}, [n.hostname, n.os && n.arch ? `${n.os}/${n.arch}` : n.os].filter(Boolean).join(' · ') || '—'),
      h('dt', {}, 'remote'), h('dd', { class: 'mono' }, n.remote || '—'),
      h('dt', {}, 'runs in flight'), h('dd', {}, connected ? String(n.runs_in_flight || 0) : '0'),
      h('dt', {}, 'config version'), h('dd', {}, connected ? String(n.config_version ?? '—') : '—')),
    h('h3', {}, 'Adapters'), adapters.length ? adapters : h('p', { class: 'muted small' }, 'none'),
    providers.length ? [h('h3', {}, 'Providers'), providers] : null);
}

// ---- Runs

async function pageRuns(root) {
  const q = new URLSearchParams(location.hash.split('?')[1] || '');
  const f = {
    node: h('select', { id: 'f-node' }, h('option', { value: '' }, 'any')),
    adapter: h('input', { id: 'f-adapter', placeholder: 'any', size: 10, value: q.get('adapter') || '' }),
    status: h('select', { id: 'f-status' }, ['', 'queued', 'running', 'succeeded', 'failed', 'cancelled'].map((v) => h('option', { value: v }, v || 'any'))),
    key: h('input', { id: 'f-key', placeholder: 'any', size: 12, value: q.get('key') || '' }),
    since: h('input', { id: 'f-since', type: 'datetime-local', value: q.get('since') || '' }),
    until: h('input', { id: 'f-until', type: 'datetime-local', value: q.get('until') || '' }),
    limit: h('input', { id: 'f-limit', type: 'number', min: 1, max: 1000, size: 5, value: q.get('limit') || '100' }),
  };
  f.status.value = q.get('status') || '';
  const form = h('form', { class: 'panel row', onsubmit: (e) => { e.preventDefault(); apply(); } },
    h('label', {}, 'node', f.node), h('label', {}, 'adapter', f.adapter), h('label', {}, 'status', f.status),
    h('label', {}, 'key', f.key), h('label', {}, 'from', f.since), h('label', {}, 'to', f.until),
    h('label', {}, 'limit', f.limit), h('button', { type: 'submit', class: 'primary' }, 'Filter'));
  const liveBox = h('div', { id: 'runs-live' });
  const liveStatus = h('div', { id: 'runs-live-status' });
  const histStatus = h('div');
  const histBox = h('div', { id: 'runs-history' });
  root.append(h('h1', {}, 'Runs'), h('h2', {}, 'In flight'), liveStatus, liveBox, h('h2', {}, 'History'), form, histStatus, histBox);

  // The link's node is an option at once: the first load must not wait for
  // GET /v1/nodes nor read an empty choice.
  if (q.get('node')) {
    f.node.append(h('option', { value: q.get('node') }, q.get('node')));
    f.node.value = q.get('node');
  }
  apiJSON('/v1/nodes').then((d) => {
    for (const n of d.nodes || []) {
      if (n.id !== q.get('node')) f.node.append(h('option', { value: n.id }, n.id));
    }
  }).catch(() => {});

  function apply() {
    const p = new URLSearchParams();
    for (const [k, el] of Object.entries(f)) if (el.value) p.set(k, el.value);
    history.replaceState(null, '', '#/runs?' + p.toString());
    load();
  }

  // In flight: runs the bus showed starting, plus the runs the edge lists
  // as running or queued (loadLive: started before the page opened, however
  // long ago) that the bus has not shown ending.
  let unfinished = [], liveLoads = 0;
  async function loadLive() {
    const mine = ++liveLoads;
    const found = [];
    let capped = false, failed = null;
    try {
      for (const status of ['running', 'queued']) {
        const p = new URLSearchParams({ status, limit: String(LIVE_LIMIT) });
        for (let page = 1; ; page++) {
          const data = await apiJSON('/v1/runs?' + p.toString(), { action: 'runs.read' });
          found.push(...(data.runs || []).filter((r) => !FINISHED.has(r.status)));
          if (!data.next_cursor) break;
          if (page >= LIVE_PAGES) { capped = true; break; }
          p.set('cursor', data.next_cursor);
        }
      }
    } catch (err) { failed = err; }
    if (mine !== liveLoads) return;
    liveStatus.replaceChildren();
    if (failed) showError(liveStatus, failed);
    else unfinished = found;
    if (capped) liveStatus.append(h('div', { class: 'notice', id: 'runs-live-capped' }, `Showing the newest ${num(found.length)} runs in flight; the edge has more.`));
    renderLive();
  }
  function renderLive() {
    const rows = new Map();
    for (const r of unfinished) {
      const st = runs.get(r.run_id);
      if (!st || !FINISHED.has(st.status)) rows.set(r.run_id, r);
    }
    for (const r of [...runs.values()].reverse()) {
      if (!r.started || FINISHED.has(r.status) || rows.has(r.run_id)) continue;
      rows.set(r.run_id, { run_id: r.run_id, node: r.node, adapter: r.adapter, target: r.target, status: r.status, created_at: r.seenAt, usage: r.usage });
    }
    liveBox.replaceChildren(rows.size ? runTable([...rows.values()]) : h('p', { class: 'muted' }, 'Nothing running.'));
  }

  // Loads overlap (Filter, or the bus's reload while one runs): only the
  // newest draws. Once Older has added pages the bus no longer reloads the
  // history (that would put back page one alone); Filter does.
  let loads = 0, paged = false;
  async function load() {
    const mine = ++loads;
    const p = new URLSearchParams();
    if (f.node.value) p.set('node', f.node.value);
    if (f.status.value) p.set('status', f.status.value);
    // adapter, key and the time range are sent too (an edge that keeps a
    // history filters there) and applied here as well.
    if (f.adapter.value) p.set('adapter', f.adapter.value);
    if (f.key.value) p.set('key', f.key.value);
    const since = f.since.value ? new Date(f.since.value) : null;
    const until = f.until.value ? new Date(f.until.value) : null;
    if (since) p.set('since', since.toISOString());
    if (until) p.set('until', until.toISOString());
    p.set('limit', f.limit.value || '100');
    let data;
    try {
      data = await apiJSON('/v1/runs?' + p.toString(), { action: 'runs.read' });
    } catch (err) {
      if (mine === loads) showError(histStatus, err);
      return;
    }
    if (mine !== loads) return;
    paged = false;
    // The nodes that did not answer (an edge without a history asks them),
    // said again after an Older that failed and worked on another try.
    const notices = () => histStatus.replaceChildren(...(data.errors || []).map((e) => h('div', { class: 'notice' }, `node ${e.node}: ${e.code}: ${e.message}`)));
    notices();
    const keep = (r) =>
      (!f.adapter.value || r.adapter === f.adapter.value) &&
      (!f.key.value || (r.key || r.api_key || r.key_id || '') === f.key.value) &&
      (!since || new Date(r.created_at) >= since) &&
      (!until || new Date(r.created_at) <= until);
    const shown = (data.runs || []).filter(keep);
    // Older pages (next_cursor) are appended under the rows shown.
    let cursor = data.next_cursor || '';
    const older = h('button', { id: 'runs-older', hidden: !cursor }, 'Older');
    older.addEventListener('click', async () => {
      older.disabled = true;
      p.set('cursor', cursor);
      let next;
      try {
        next = await apiJSON('/v1/runs?' + p.toString(), { action: 'runs.read' });
      } catch (err) {
        older.disabled = false;
        if (mine === loads) showError(histStatus, err);
        return;
      }
      if (mine !== loads) return; // a newer load replaced this table
      notices(); // not a failed try's error any more
      paged = true;
      shown.push(...(next.runs || []).filter(keep));
      cursor = next.next_cursor || '';
      table.replaceChildren(shown.length ? runTable(shown) : h('p', { class: 'muted' }, 'No runs match.'));
      older.hidden = !cursor;
      older.disabled = false;
    });
    const table = h('div', {}, shown.length ? runTable(shown) : h('p', { class: 'muted' }, 'No runs match.'));
    histBox.replaceChildren(table, older);
    // The history's word on a run's end settles a run the bus showed start
    // but not end (its terminal event was lost), as a run's page does:
    // otherwise it stayed in flight here while the history showed it done.
    for (const r of data.runs || []) settleRun(runs.get(r.run_id), r);
    renderLive();
  }

  renderLive();
  const reload = coalesce(400, 2000, load);
  const reloadLive = coalesce(400, 2000, loadLive);
  const relive = coalesce(100, 500, renderLive);
  listenBus((type, ev) => {
    // The bus lost events: resyncBus settled the runs it knew; the runs in
    // flight and the history are read again for the rest (the history
    // unless Older added pages).
    if (type === 'bus.resync') {
      relive();
      reloadLive();
      if (!paged) reload();
      return;
    }
    if (type !== 'run.event' || !ev.run) return;
    relive();
    if (TERMINAL.has(ev.run.type) || ev.run.type === 'start') {
      reloadLive();
      if (!paged) reload();
    }
  });
  await Promise.all([reloadLive.now(), reload.now()]);
}

// LIVE_LIMIT and LIVE_PAGES bound how many runs in flight the Runs page
// reads (per status: running, queued).
const LIVE_LIMIT = 200, LIVE_PAGES = 5;

function runTable(rows) {
  return h('table', { class: 'runs' },
    h('thead', {}, h('tr', {}, ['run', 'node', 'adapter', 'target', 'status', 'created', 'duration', 'tokens', 'cost', 'error'].map((c) => h('th', {}, c)))),
    h('tbody', {}, rows.map((r) => h('tr', { 'data-run': r.run_id },
      h('td', { class: 'mono' }, h('a', { href: '#/run/' + encodeURIComponent(r.run_id) }, r.run_id)),
      h('td', {}, r.node || ''), h('td', {}, r.adapter || ''), h('td', {}, r.target || ''),
      h('td', {}, badge(r.status || '')), h('td', {}, fmtTime(r.created_at)),
      h('td', {}, dur(r.started_at || r.created_at, r.finished_at)),
      h('td', {}, r.usage && r.usage.total_tokens ? num(r.usage.total_tokens) : ''),
      h('td', {}, r.usage ? cost(r.usage.cost_usd) : ''),
      h('td', { class: 'small' }, r.error ? `${r.error.code}: ${r.error.message}` : '')))));
}

// ---- one run

function runView(r) {
  const out = h('pre', { class: 'out', id: 'run-output' });
  const reasoning = h('pre', { class: 'out reasoning', id: 'run-reasoning' });
  const events = h('tbody');
  const usage = h('dl', { class: 'kv', id: 'run-usage' });
  const error = h('div', { id: 'run-error' });
  const cut = h('div', { id: 'run-cut', class: 'notice', hidden: true });
  const el = h('div', {}, cut,
    h('div', { class: 'cols' },
      h('div', {}, h('h3', {}, 'Output'), out),
      h('div', { id: 'reasoning-box', hidden: true }, h('h3', {}, 'Reasoning'), reasoning)),
    error,
    h('div', { class: 'cols' },
      h('div', {}, h('h3', {}, 'Usage'), usage),
      h('div', {}, h('h3', {}, 'Events'), h('table', { class: 'events-table' },
        h('thead', {}, h('tr', {}, h('th', {}, 'seq'), h('th', {}, 'type'), h('th', {}, 'data'))), events))));
  const unset = {};
  let shown = 0, shownUsage = unset, shownError = unset, shownCut = '';
  function update(state) {
    // What the bounds cut (foldEvent) is said, not silently left out.
    const parts = [];
    if (state.outputCut) parts.push(`output cut: showing the last ${num(state.output.length)} characters; ${num(state.outputCut)} earlier ones not shown`);
    if (state.reasoningCut) parts.push(`reasoning cut: ${num(state.reasoningCut)} earlier characters not shown`);
    if (state.eventsCut) parts.push(`${num(state.eventsCut)} earlier events not shown`);
    const c = parts.length ? parts.join('; ') + ` (this page keeps a run's last ${num(MAX_OUTPUT)} characters of output and last ${num(MAX_EVENTS_PER_RUN)} events).` : '';
    if (c !== shownCut) {
      shownCut = c;
      cut.textContent = c.charAt(0).toUpperCase() + c.slice(1);
      cut.hidden = !c;
    }
    const stick = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
    if (out.textContent !== state.output) out.textContent = state.output;
    if (stick) out.scrollTop = out.scrollHeight;
    if (state.reasoning) {
      el.querySelector('#reasoning-box').hidden = false;
      if (reasoning.textContent !== state.reasoning) reasoning.textContent = state.reasoning;
    }
    // shown counts the events drawn of all the run had (eventsTotal); the
    // list holds its last ones only.
    const total = state.eventsTotal || state.events.length;
    for (shown = Math.max(shown, total - state.events.length); shown < total; shown++) {
      const ev = state.events[state.events.length - (total - shown)];
      events.append(h('tr', {}, h('td', {}, ev.seq ?? ''), h('td', {}, ev.type), h('td', { class: 'sum' }, ev.data)));
    }
    while (events.childElementCount > MAX_EVENTS_PER_RUN) events.firstElementChild.remove();
    // Usage and error are drawn again only when they change: the pages
    // update once a frame while a run streams, and a list rebuilt that
    // often cannot be selected.
    const u = state.usage;
    if (u !== shownUsage) {
      shownUsage = u;
      // A cost is not a count: num() rounds to three decimals ($0.000123
      // read "0").
      const shownValue = (k, v) => k === 'cost_usd' ? cost(v) || '$0' : typeof v === 'number' ? num(v) : String(v);
      usage.replaceChildren(...(u ? Object.entries(u).flatMap(([k, v]) => [h('dt', {}, k.replaceAll('_', ' ')), h('dd', {}, shownValue(k, v))]) : [h('dd', { class: 'muted' }, 'none reported')]));
    }
    if (state.error !== shownError) {
      shownError = state.error;
      error.replaceChildren(state.error ? h('div', { class: 'error-box' }, `${state.error.code}: ${state.error.message}`) : '');
    }
  }
  return { el, update };
}

function cancelButton(getID, onDone) {
  const b = h('button', { class: 'danger', id: 'cancel', hidden: !allowed('runs.cancel') }, 'Cancel');
  b.addEventListener('click', async () => {
    const id = getID();
    if (!id) return;
    b.disabled = true;
    try {
      await api(`/v1/runs/${encodeURIComponent(id)}/cancel`, { method: 'POST', action: 'runs.cancel' });
      b.textContent = 'Cancelling…';
    } catch (err) {
      b.disabled = false;
      if (err.scope) b.hidden = true;
      onDone(err);
    }
  });
  return b;
}

async function pageRun(root, id) {
  const head = h('div', { class: 'row' });
  const rec = h('dl', { class: 'kv', id: 'run-record' });
  // The note says why the record could not be read (until it is), why
  // Cancel failed, or, while the page has seen none of the run's events,
  // where its output will appear: each part on its own, so that a record
  // read at last clears its error, and a run that streams, the hint.
  const recNote = h('div'), cancelNote = h('div'), hint = h('div');
  const note = h('div', {}, recNote, cancelNote, hint);
  // A page's own placeholder until the bus shows the run: opening a run's
  // page must not add it to the tab's runs (the Runs page lists those in
  // flight) nor guess its status.
  const local = { run_id: id, status: '', events: [], output: '', reasoning: '', usage: null, error: null };
  const view = runView(runs.get(id) || local);
  // A run that ended before its Cancel reached the edge: its end is read
  // from the record at once, where the page would otherwise show it
  // running, and offer Cancel, until the live feed told it (a feed
  // reconnecting after the edge restarted may take 30 s).
  const cancel = cancelButton(() => id, (err) => {
    showError(cancelNote, err);
    if (err.code === 'run_finished') loadRecord();
  });
  root.append(h('h1', {}, 'Run ', h('span', { class: 'mono' }, id)), head, note, h('div', { class: 'panel' }, rec), view.el);
  onCleanup(pinRun(id));

  let record = null, drawnRecord = null;
  async function loadRecord() {
    try {
      record = await apiJSON('/v1/runs/' + encodeURIComponent(id), { action: 'runs.read' });
    } catch (err) {
      if (!record) {
        showError(recNote, err);
        render();
      }
      return;
    }
    recNote.replaceChildren();
    render();
  }
  function render() {
    const st = runs.get(id);
    // A finished record settles a run the bus saw start but not end.
    settleRun(st, record);
    const status = (record && FINISHED.has(record.status)) ? record.status : (st ? st.status : record && record.status);
    // Only what changed is touched, so the Cancel button stays the same
    // element under a user's pointer.
    const shown = head.dataset.status;
    if (shown !== (status || 'unknown')) {
      head.dataset.status = status || 'unknown';
      head.replaceChildren(h('span', { id: 'run-status' }, badge(status || 'unknown')), status && !FINISHED.has(status) ? cancel : '');
    }
    // The record changes only when it is read again, while this draws up
    // to once a frame during a stream: rebuilt each time, it could not be
    // selected.
    if (record && record !== drawnRecord) {
      drawnRecord = record;
      rec.replaceChildren(...['node', 'adapter', 'target', 'session_id', 'background', 'created_at', 'started_at', 'finished_at']
        .filter((k) => record[k] !== undefined && record[k] !== '')
        .flatMap((k) => [h('dt', {}, k.replaceAll('_', ' ')), h('dd', {}, k.endsWith('_at') ? fmtTime(record[k]) : String(record[k]))]));
    }
    const state = runs.get(id) || local;
    if (record && record.node && !state.node) state.node = record.node;
    if (record && record.usage && !state.usage) state.usage = record.usage;
    if (record && record.error && !state.error) state.error = record.error;
    view.update(state);
    // The record's error, while there is one, says more than the hint.
    if (!state.events.length && !recNote.firstChild) {
      if (!hint.firstChild) hint.replaceChildren(h('p', { class: 'muted small' }, 'Output appears here as it streams. The node keeps the run\'s record, not its output: output of a run that streamed before this console was open is not shown.'));
    } else if (hint.firstChild) {
      hint.replaceChildren();
    }
  }
  render();
  const refresh = coalesce(300, 2000, loadRecord);
  const rerender = perFrame(render);
  listenBus((type, ev) => {
    if (type === 'bus.resync') { // its end may be among the events lost
      refresh();
      return;
    }
    if (type === 'run.event' && ev.run && ev.run.run_id === id) {
      rerender();
      if (TERMINAL.has(ev.run.type)) {
        refresh();
        // The store records the end a moment after the terminal event.
        const t = setTimeout(loadRecord, 2000);
        onCleanup(() => clearTimeout(t));
      }
    }
  });
  await refresh.now();
}

// ---- Start a run

async function pageStart(root) {
  if (!allowed('runs.start')) {
    root.append(h('h1', {}, 'Start a run'), h('div', { class: 'notice', id: 'start-forbidden' }, 'This API key may not start runs: it lacks the "runs" scope.'));
    return;
  }
  let node = h('select', { id: 'start-node' }, h('option', { value: '' }, 'any node'));
  let adapter = h('select', { id: 'start-adapter', required: true });
  const target = h('input', { id: 'start-target', list: 'start-targets', placeholder: 'target or model', size: 24 });
  const targets = h('datalist', { id: 'start-targets' });
  const session = h('input', { id: 'start-session', placeholder: 'optional', size: 14 });
  const input = h('textarea', { id: 'start-input', placeholder: 'input (stdin for exec targets, the prompt for LLMs and agents)' });
  const submit = h('button', { type: 'submit', class: 'primary', id: 'start-submit' }, 'Start');
  const status = h('span', { id: 'start-status' });
  const runLink = h('span', { id: 'start-run' });
  const note = h('div');
  const nodesNote = h('div', { id: 'start-nodes' });
  let runID = '';
  const cancel = cancelButton(() => runID, (err) => showError(note, err));
  cancel.hidden = true;
  const view = runView({ output: '', reasoning: '', events: [] });
  const form = h('form', { class: 'panel', id: 'start-form', onsubmit: (e) => { e.preventDefault(); start(); } },
    h('div', { class: 'row' }, h('label', {}, 'node', node), h('label', {}, 'adapter', adapter), h('label', {}, 'target', target, targets),
      h('label', {}, 'session', session)),
    nodesNote,
    h('div', { style: 'margin-top:10px' }, input),
    h('div', { class: 'row', style: 'margin-top:10px' }, submit, cancel, status, runLink),
    h('p', { class: 'muted small' }, 'The run streams to this tab: it goes on while you look at other pages, and closing the tab cancels it.'));
  root.append(h('h1', {}, 'Start a run'), form, note, view.el);

  // freeText: the key may not list the nodes (GET /v1/nodes needs the
  // "read" scope, starting a run "runs"), so node and adapter are typed.
  let nodes = [], freeText = false, busy = false;
  function fillAdapters() {
    const chosen = nodes.filter((n) => !node.value || n.id === node.value);
    const names = [...new Set(chosen.flatMap((n) => (n.adapters || []).map((a) => a.name)))];
    const prev = adapter.value;
    adapter.replaceChildren(...names.map((a) => h('option', { value: a }, a)));
    if (names.includes(prev)) adapter.value = prev;
    const models = [...new Set(chosen.flatMap((n) => (n.providers || []).flatMap((p) => p.models || [])))];
    targets.replaceChildren(...models.map((m) => h('option', { value: m })));
  }
  node.addEventListener('change', fillAdapters);
  // Start is offered once there is somewhere to start a run, so that an
  // empty adapter list does not end in the browser's "select an item".
  const updateSubmit = () => { submit.disabled = busy || (!freeText && !nodes.length); };
  function useFreeText() {
    freeText = true;
    const n = h('input', { id: 'start-node', placeholder: 'any node', size: 12 });
    const a = h('input', { id: 'start-adapter', required: true, placeholder: 'adapter name', size: 12 });
    node.replaceWith(n);
    adapter.replaceWith(a);
    node = n;
    adapter = a;
    targets.replaceChildren();
    nodesNote.replaceChildren(h('p', { class: 'muted small', id: 'start-free-text' },
      'This API key may not list the nodes (it lacks the "read" scope): type the adapter\'s name, and a node\'s to pick one.'));
    updateSubmit();
  }
  // loadNodes fills the choices from GET /v1/nodes, at first and again as
  // nodes connect, leave or begin to stop: a page opened before any node
  // was connected would otherwise offer nothing until it is opened again.
  async function loadNodes() {
    if (freeText) return;
    let list;
    try {
      list = (await apiJSON('/v1/nodes')).nodes || [];
    } catch (err) {
      if (err.scope) useFreeText();
      else showError(nodesNote, err);
      return;
    }
    // A run needs a connected node, and a draining one takes no new run.
    nodes = list.filter((n) => online(n) && !n.draining);
    const prev = node.value;
    const options = nodes.map((n) => h('option', { value: n.id }, n.id));
    // A chosen node that left or is stopping stays chosen, marked so,
    // rather than the run silently going to any node.
    if (prev && !nodes.some((n) => n.id === prev)) options.push(h('option', { value: prev }, prev + ' (unavailable)'));
    node.replaceChildren(h('option', { value: '' }, 'any node'), ...options);
    node.value = prev;
    fillAdapters();
    nodesNote.replaceChildren(nodes.length ? '' : h('div', { class: 'notice', id: 'start-no-node' },
      'No connected node: a run needs one. The choices fill in when a node connects.'));
    updateSubmit();
  }
  const reloadNodes = coalesce(250, 2000, loadNodes);
  listenBus((type) => {
    if (!freeText && (type === 'bus.resync' || type.startsWith('node.'))) reloadNodes();
  });
  await reloadNodes.now();
  // Leaving the page does not abort the stream: a foreground run is
  // cancelled when its caller goes away, and moving to the run's own page
  // must not do that. Closing the tab does.

  // current counts the runs started here: a run followed after its stream
  // died (follow) stops touching the page once another is started.
  let current = 0;

  async function start() {
    const mine = ++current;
    note.replaceChildren();
    runID = '';
    runLink.replaceChildren();
    const state = { output: '', reasoning: '', events: [], usage: null, error: null };
    const fresh = runView(state);
    view.el.replaceWith(fresh.el);
    view.el = fresh.el;
    view.update = fresh.update;
    busy = true;
    updateSubmit();
    status.replaceChildren(badge('streaming'));
    const body = { adapter: adapter.value, target: target.value, input: input.value };
    if (node.value) body.node = node.value;
    if (session.value) body.session_id = session.value;
    let last = 'error', own = null, stalled = null;
    try {
      const resp = await api('/v1/runs', { method: 'POST', json: body, stream: true, action: 'runs.start', headers: { Accept: 'text/event-stream' } });
      runID = resp.headers.get('X-IOP-Run-ID') || '';
      if (runID) {
        // While this stream runs, the run's state follows it alone: it holds
        // every event, in order, where the bus may drop some (applyRunEvent
        // would then take a later seq first and the missed ones never).
        own = runState(runID, resp.headers.get('X-IOP-Node') || undefined);
        own.ownStream = true;
        runLink.replaceChildren(h('a', { href: '#/run/' + encodeURIComponent(runID), class: 'mono' }, runID), ' on ', resp.headers.get('X-IOP-Node') || '');
        cancel.hidden = !allowed('runs.cancel');
        cancel.disabled = false;
        cancel.textContent = 'Cancel';
      }
      // One redraw per frame, not one per event: a redraw sets the whole
      // output and reads its layout, so a run of thousands of small deltas
      // took minutes to stream here (and a hidden tab draws nothing until
      // it is shown again).
      let drawn = true;
      const draw = () => {
        if (drawn) return;
        drawn = true;
        fresh.update(state);
      };
      // A stream silent for SSE_IDLE_MS (the edge sends a keep-alive every
      // 15 s) is taken for dead, as the event feeds' are, and closed:
      // follow() then takes the run from the bus and the edge's record.
      // Closing it cancels the run if the edge still holds the connection
      // (a proxy that keeps it open without passing anything on), as
      // closing the tab does; a tab the browser froze meanwhile is not
      // taken for dead on its timer alone (see readSSE).
      await readSSE(resp, (type, data) => {
        let ev;
        try { ev = JSON.parse(data); } catch { return; }
        if (!runID && ev.run_id) runID = ev.run_id;
        applyRunEvent(ev);
        // The pages hear it as from the bus, which skips this run while
        // this stream runs (and may be off: a key without the events scope);
        // "local" keeps it off the Events page, which shows the bus's copy.
        notifyBus('run.event', { type: 'run.event', node: ev.node, run: ev, local: true });
        foldEvent(state, ev);
        if (TERMINAL.has(ev.type)) last = ev.type;
        if (drawn) {
          drawn = false;
          requestAnimationFrame(draw);
        }
      }, { idleMs: SSE_IDLE_MS });
      draw();
      status.replaceChildren(badge(statusOfTerminal(last)));
    } catch (err) {
      if (err instanceof IdleError && own) {
        stalled = err;
      } else {
        status.replaceChildren(badge('failed'));
        // Only the edge's scope refusal says the key may not start runs;
        // another 403 (a session another key owns) is shown as the edge
        // gave it, and the form stays usable.
        if (err.scope) {
          showError(note, { code: 'forbidden', message: 'this API key may not start runs' });
          form.hidden = true;
        } else {
          showError(note, err);
        }
      }
    } finally {
      if (own) releaseRun(own); // the bus takes over a stream that broke
      busy = false;
      updateSubmit();
      if (!stalled) cancel.hidden = true;
    }
    if (stalled) await follow(own, stalled, fresh, mine);
  }

  // follow keeps showing a run whose stream was taken for dead: from the
  // run's state, which the bus now feeds (with what it carried while the
  // stream was silent), and from GET /v1/runs/{id}, asked at once, then
  // after 1 s and at doubling intervals up to 30 s (on a key without the
  // events scope, the record alone tells the end), until the run is over.
  // Once another run is started here, it settles the run's state for the
  // other pages but no longer touches this one.
  async function follow(own, err, view, mine) {
    const shown = () => mine === current;
    const msg = h('span', { id: 'start-stalled-state' }, 'Asking the edge about the run…');
    note.replaceChildren(h('div', { class: 'notice', id: 'start-stalled' }, `The run's stream stopped: ${err.message}. `, msg));
    status.replaceChildren(badge('running'));
    let wake = null, drawn = true;
    const draw = () => {
      drawn = true;
      if (shown()) view.update(own);
    };
    const listener = (type, ev) => {
      if (type === 'bus.resync' || (type === 'run.event' && ev.run && ev.run.run_id === own.run_id)) {
        if (drawn) {
          drawn = false;
          requestAnimationFrame(draw);
        }
        if ((type === 'bus.resync' || TERMINAL.has(ev.run.type)) && wake) wake();
      }
    };
    busListeners.add(listener);
    const unpin = pinRun(own.run_id);
    const end = (badgeText, text) => {
      if (!shown()) return;
      view.update(own);
      msg.textContent = text;
      status.replaceChildren(badge(badgeText));
      cancel.hidden = true;
    };
    try {
      for (let wait = 1000; ; wait = Math.min(wait * 2, 30000)) {
        let rec = null, why = '';
        try {
          rec = await apiJSON('/v1/runs/' + encodeURIComponent(own.run_id), { action: 'runs.read' });
        } catch (e) {
          if (e.status === 404 || e.status === 403) {
            end('unknown', `The edge cannot tell how it went (${e.code || e.status}: ${e.message}).`);
            return;
          }
          why = e.message || String(e);
        }
        settleRun(own, rec);
        if (FINISHED.has(own.status)) {
          end(own.status, `The run ended: ${own.status} (its end as the edge recorded it; output that came meanwhile is shown if the event feed carried it).`);
          return;
        }
        if (shown()) {
          view.update(own);
          msg.textContent = rec ? 'The run goes on: it is followed on the event feed and the edge\'s record.'
            : `The edge did not answer about the run (${why}); asking again in ${Math.round(wait / 1000)} s.`;
        }
        await new Promise((r) => { wake = r; setTimeout(r, wait); });
        wake = null;
      }
    } finally {
      busListeners.delete(listener);
      unpin();
    }
  }
}

// ---- Usage

const PALETTE = ['#2f5fd0', '#1d8a4e', '#c0392b', '#b7791f', '#7b3fb5', '#138a9e', '#d35d96', '#5b6b86', '#8a9a1d', '#e07b24'];

const USAGE_PAGES = 20;

async function pageUsage(root) {
  const q = new URLSearchParams(location.hash.split('?')[1] || '');
  const pageSize = Math.min(Math.max(Math.trunc(Number(q.get('limit'))) || 1000, 1), 1000);
  const groupBy = h('select', { id: 'u-group' }, ['node', 'adapter', 'model', 'key'].map((v) => h('option', { value: v }, v)));
  const metric = h('select', { id: 'u-metric' }, [['requests', 'requests'], ['total_tokens', 'tokens'], ['cost_usd', 'cost (USD)']].map(([v, t]) => h('option', { value: v }, t)));
  const range = h('select', { id: 'u-range' }, [['3600', 'last hour'], ['86400', 'last 24 h'], ['604800', 'last 7 days'], ['0', 'all']].map(([v, t]) => h('option', { value: v }, t)));
  range.value = '86400';
  const chart = h('div', { id: 'usage-chart' });
  const totals = h('div', { id: 'usage-totals' });
  const tunnels = h('div', { id: 'usage-tunnels' });
  const apiTotals = h('div', { class: 'panel', id: 'usage-api', hidden: true });
  const note = h('div');
  for (const el of [groupBy, metric, range]) el.addEventListener('change', () => load());
  root.append(h('h1', {}, 'Usage'),
    h('div', { class: 'panel row' }, h('label', {}, 'group by', groupBy), h('label', {}, 'measure', metric), h('label', {}, 'time', range),
      h('button', { onclick: () => load() }, 'Refresh')),
    note,
    h('div', { class: 'panel' }, h('h2', { style: 'margin-top:0' }, 'Runs over time'), chart, totals),
    apiTotals,
    h('div', { class: 'panel' }, h('h2', { style: 'margin-top:0' }, 'Provider tunnels (OpenAI/Ollama surfaces)'), tunnels));

  // Loads overlap (a change, Refresh, or the bus's reload while one runs):
  // only the newest draws, or an older one finishing last would put its
  // stale totals back.
  let loads = 0;
  async function load() {
    const mine = ++loads;
    const secs = Number(range.value);
    const since = secs ? new Date(Date.now() - secs * 1000) : null;
    // The runs of the range, newest first, page by page (next_cursor) up to
    // USAGE_PAGES pages; #/usage?limit=N sets the page size (default 1000).
    let list = [], capped = false, failed = null;
    try {
      const p = new URLSearchParams({ limit: String(pageSize) });
      if (since) p.set('since', since.toISOString());
      for (let page = 1; ; page++) {
        const data = await apiJSON('/v1/runs?' + p.toString(), { action: 'runs.read' });
        list.push(...(data.runs || []).filter((r) => !since || new Date(r.created_at) >= since));
        if (!data.next_cursor) break;
        if (page >= USAGE_PAGES) { capped = true; break; }
        p.set('cursor', data.next_cursor);
      }
    } catch (err) { failed = err; }
    if (mine !== loads) return;
    note.replaceChildren();
    if (failed) showError(note, failed);
    if (capped) note.append(h('div', { class: 'notice', id: 'usage-capped' }, `Showing the newest ${num(list.length)} runs of this time range; older ones are left out of the chart and totals.`));
    const key = (r) => {
      switch (groupBy.value) {
        case 'model': return (r.usage && r.usage.model) || r.model || r.target || '(none)';
        case 'key': return r.key || r.api_key || r.key_id || '(no key)';
        default: return r[groupBy.value] || '(none)';
      }
    };
    const value = (r) => metric.value === 'requests' ? 1 : Number((r.usage && r.usage[metric.value]) || 0);
    chart.replaceChildren(barChart(list.map((r) => ({ t: new Date(r.created_at), group: key(r), v: value(r) })), since, metric.value));
    const sums = new Map();
    for (const r of list) {
      const g = key(r);
      const e = sums.get(g) || { runs: 0, failed: 0, tokens: 0, cost: 0 };
      e.runs++;
      if (r.status === 'failed') e.failed++;
      e.tokens += (r.usage && r.usage.total_tokens) || 0;
      e.cost += (r.usage && r.usage.cost_usd) || 0;
      sums.set(g, e);
    }
    totals.replaceChildren(h('table', {}, h('thead', {}, h('tr', {}, [groupBy.value, 'runs', 'failed', 'tokens', 'cost'].map((c) => h('th', {}, c)))),
      h('tbody', {}, [...sums.entries()].sort((a, b) => b[1].runs - a[1].runs).map(([g, e]) =>
        h('tr', {}, h('td', {}, g), h('td', {}, num(e.runs)), h('td', {}, num(e.failed)), h('td', {}, num(e.tokens)), h('td', {}, cost(e.cost)))))));
    // GET /v1/usage: an edge with a history answers {"usage":[{group, runs,
    // requests, total_tokens, cost_usd, …}]} for ?group_by=key|node|model|day;
    // every edge adds its live tunnel ledger as "tunnels".
    let u = null;
    try {
      const p = new URLSearchParams({ group_by: groupBy.value === 'adapter' ? 'node' : groupBy.value });
      if (since) p.set('since', since.toISOString());
      u = await apiJSON('/v1/usage?' + p.toString(), { action: 'usage.read' });
    } catch (err) { if (mine === loads) showError(tunnels, err); }
    if (mine !== loads) return;
    if (u && Array.isArray(u.usage) && groupBy.value !== 'adapter') {
      const m = metric.value;
      apiTotals.replaceChildren(h('h2', { style: 'margin-top:0' }, `Totals by ${u.group_by || groupBy.value} (GET /v1/usage)`),
        hbarChart(u.usage.map((g) => ({ group: g.group || '(none)', v: Number(g[m] || 0) })), m),
        h('table', {}, h('thead', {}, h('tr', {}, [u.group_by || 'group', 'runs', 'tunnels', 'requests', 'errors', 'tokens', 'cost'].map((c) => h('th', {}, c)))),
          h('tbody', {}, u.usage.map((g) => h('tr', {}, h('td', {}, g.group || '(none)'), h('td', {}, num(g.runs)), h('td', {}, num(g.tunnels)),
            h('td', {}, num(g.requests)), h('td', {}, num(g.errors)), h('td', {}, num(g.total_tokens)), h('td', {}, cost(g.cost_usd)))))));
      apiTotals.hidden = false;
    } else {
      apiTotals.hidden = true;
    }
    if (u) {
      // The ledger keeps a line per node, key, provider and model: without
      // the key, two keys' lines of a model read as one line twice.
      const lines = u.tunnels || [];
      tunnels.replaceChildren(lines.length ? h('table', {},
        h('thead', {}, h('tr', {}, ['node', 'key', 'provider', 'model', 'requests', 'errors', 'prompt', 'completion', 'total tokens', 'bytes'].map((c) => h('th', {}, c)))),
        h('tbody', {}, lines.map((l) => h('tr', {}, h('td', {}, l.node), h('td', {}, l.key || ''), h('td', {}, l.provider), h('td', { class: 'mono' }, l.model),
          h('td', {}, num(l.requests)), h('td', {}, num(l.errors)), h('td', {}, num(l.prompt_tokens)), h('td', {}, num(l.completion_tokens)),
          h('td', {}, num(l.total_tokens)), h('td', {}, num(l.body_bytes))))))
        : h('p', { class: 'muted' }, 'No provider tunnel traffic since the edge started.'));
    }
  }
  const reload = coalesce(1000, 2000, load);
  listenBus((type, ev) => {
    if (type === 'bus.resync' || type === 'tunnel.completed' || (type === 'run.event' && ev.run && TERMINAL.has(ev.run.type))) reload();
  });
  await reload.now();
}

// niceMax rounds a chart's top up so its four gridlines fall on round
// values: whole numbers for counts (requests, tokens), so a step of 2.5 is
// taken only where it is a whole number (25, 250, …) or for cost.
function niceMax(v, metricName) {
  if (!(v > 0)) return 1;
  const counts = metricName !== 'cost_usd';
  if (counts && v <= 4) return 4;
  const mag = Math.pow(10, Math.floor(Math.log10(v / 4)));
  for (const f of [1, 2, 2.5, 5, 10]) {
    if (counts && !Number.isInteger(f * mag)) continue;
    if (f * mag * 4 >= v) return f * mag * 4;
  }
  return v;
}

// hbarChart draws one horizontal bar per group.
function hbarChart(items, metricName) {
  items = items.filter((i) => i.v > 0).sort((a, b) => b.v - a.v).slice(0, 20);
  if (!items.length) return h('p', { class: 'muted' }, 'Nothing recorded in this time range.');
  const W = 900, row = 24, L = 180, R = 90, H = items.length * row + 8;
  const max = Math.max(...items.map((i) => i.v));
  const fmt = (v) => metricName === 'cost_usd' ? chartCost(v) : v.toLocaleString();
  const svg = s('svg', { class: 'chart', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': `${metricName} by group` });
  items.forEach((it, i) => {
    const w = Math.max(2, (W - L - R) * it.v / max);
    const y = 4 + i * row;
    svg.append(s('text', { x: L - 8, y: y + 15, 'text-anchor': 'end' }, it.group.length > 28 ? it.group.slice(0, 27) + '…' : it.group),
      s('rect', { class: 'bar', 'data-group': it.group, x: L, y: y + 3, width: w, height: row - 8, fill: PALETTE[i % PALETTE.length] }, s('title', {}, `${it.group}: ${fmt(it.v)}`)),
      s('text', { x: L + w + 6, y: y + 15 }, fmt(it.v)));
  });
  return svg;
}

// barChart draws points {t, group, v} as stacked bars per time bucket.
function barChart(points, since, metricName) {
  if (!points.length) return h('p', { class: 'muted' }, 'No runs in this time range.');
  const W = 900, H = 260, L = 56, R = 12, T = 12, B = 34, N = 24;
  const t0 = since ? since.getTime() : Math.min(...points.map((p) => p.t.getTime()));
  const t1 = Math.max(Date.now(), ...points.map((p) => p.t.getTime())) + 1;
  const step = Math.max(1, (t1 - t0) / N);
  const groups = [...new Set(points.map((p) => p.group))].sort();
  const color = (g) => PALETTE[groups.indexOf(g) % PALETTE.length];
  const buckets = Array.from({ length: N }, () => new Map());
  for (const p of points) {
    const i = Math.min(N - 1, Math.max(0, Math.floor((p.t.getTime() - t0) / step)));
    buckets[i].set(p.group, (buckets[i].get(p.group) || 0) + p.v);
  }
  const max = niceMax(Math.max(...buckets.map((b) => [...b.values()].reduce((a, c) => a + c, 0)), 0), metricName);
  const bw = (W - L - R) / N;
  const y = (v) => T + (H - T - B) * (1 - v / max);
  const fmt = (v) => metricName === 'cost_usd' ? chartCost(v) : (Number.isInteger(v) ? v.toLocaleString() : v.toFixed(1));
  const svg = s('svg', { class: 'chart', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': `${metricName} over time by group` });
  for (let k = 0; k <= 4; k++) {
    const v = (max * k) / 4;
    svg.append(s('line', { class: 'axis', x1: L, x2: W - R, y1: y(v), y2: y(v) }), s('text', { x: L - 6, y: y(v) + 4, 'text-anchor': 'end' }, fmt(v)));
  }
  buckets.forEach((b, i) => {
    let acc = 0;
    for (const g of groups) {
      const v = b.get(g);
      if (!v) continue;
      const x = L + i * bw + 2;
      svg.append(s('rect', { class: 'bar', 'data-group': g, x, width: Math.max(1, bw - 4), y: y(acc + v), height: Math.max(1, y(acc) - y(acc + v)), fill: color(g) },
        s('title', {}, `${g}: ${fmt(v)} (${fmtTime(t0 + i * step)} – ${fmtTime(t0 + (i + 1) * step)})`)));
      acc += v;
    }
  });
  for (let i = 0; i <= N; i += 6) {
    const d = new Date(t0 + i * step);
    const label = (t1 - t0) > 86400000 ? d.toLocaleDateString(undefined, { month: 'short', day: 'numeric' }) + ' ' + d.toLocaleTimeString(undefined, { hour: '2-digit', minute: '2-digit' }) : d.toLocaleTimeString(undefined, { hour: '2-digit', minute: '2-digit' });
    svg.append(s('text', { x: L + i * bw, y: H - 12, 'text-anchor': i === 0 ? 'start' : i === N ? 'end' : 'middle' }, label));
  }
  return h('div', {}, svg, h('div', { class: 'legend' }, groups.map((g) => h('span', {}, h('i', { style: `background:${color(g)}` }), g))));
}

// ---- Events

async function pageEvents(root) {
  const q = new URLSearchParams(location.hash.split('?')[1] || '');
  const types = h('input', { id: 'ev-types', size: 40, placeholder: 'all types, or e.g. node.*,run.event', value: q.get('type') || '' });
  const pause = h('button', { type: 'button', id: 'ev-pause' }, 'Pause');
  const rows = h('tbody', { id: 'events' });
  const note = h('div');
  const count = h('span', { class: 'muted small' });
  const quick = ['node.*', 'run.event', 'tunnel.completed', 'config.reloaded'].map((t) => h('button', { type: 'button', class: 'small', onclick: () => { types.value = t; apply(); } }, t));
  root.append(h('h1', {}, 'Events'),
    h('form', { class: 'panel row', onsubmit: (e) => { e.preventDefault(); apply(); } },
      h('label', {}, 'types', types), h('button', { type: 'submit', class: 'primary' }, 'Apply'), quick, pause,
      h('button', { type: 'button', onclick: () => { rows.replaceChildren(); n = 0; count.textContent = ''; } }, 'Clear'), count),
    h('p', { class: 'muted small' }, 'The tab\'s one live feed (GET /v1/events), filtered here: a type, or a prefix ending in *, comma-separated.'),
    note,
    h('table', { class: 'events-table' }, h('thead', {}, h('tr', {}, ['time', 'type', 'node', 'detail'].map((c) => h('th', {}, c)))), rows));
  let paused = false, n = 0, match = typeMatcher(types.value);
  pause.addEventListener('click', () => { paused = !paused; pause.textContent = paused ? 'Resume' : 'Pause'; });
  function apply() {
    history.replaceState(null, '', '#/events' + (types.value ? '?type=' + encodeURIComponent(types.value) : ''));
    match = typeMatcher(types.value);
  }

  // The feed's state: retried with a countdown and a "Reconnect now"
  // button, or refused with a "Reconnect" button (startBus).
  let countdown = null;
  onCleanup(() => clearInterval(countdown));
  function showState(st) {
    clearInterval(countdown);
    countdown = null;
    const now = h('button', { type: 'button', id: 'ev-reconnect', onclick: reconnectBus }, st.phase === 'refused' ? 'Reconnect' : 'Reconnect now');
    if (st.phase === 'retry') {
      const left = h('span', { id: 'ev-retry-in' });
      const tick = () => { left.textContent = `Reconnecting in ${Math.max(1, Math.ceil((st.due - Date.now()) / 1000))} s. `; };
      tick();
      countdown = setInterval(tick, 1000);
      note.replaceChildren(h('div', { class: 'notice', id: 'ev-stopped', 'data-retry': '', 'data-idle': st.idle }, st.why + ' ', left, now));
    } else if (st.phase === 'hidden') {
      note.replaceChildren(h('div', { class: 'notice', id: 'ev-stopped', 'data-retry': '', 'data-idle': st.idle }, st.why + ' ',
        h('span', { id: 'ev-retry-in' }, 'Reconnecting when this tab is shown again. '), now));
    } else if (st.phase === 'refused') {
      const s = st.err.status;
      const what = s === 401 || s === 403 ? 'The API key may not read the event stream' : 'The edge refused the event stream';
      note.replaceChildren(h('div', { class: 'error-box', id: 'ev-stopped', 'data-refused': '' },
        `${what} (${st.err.code ? st.err.code + ': ' : ''}${st.err.message}). `, now));
    } else {
      note.replaceChildren();
    }
  }
  // A key already known not to read events never started the feed.
  showState(!busRunning && !allowed('events') && busState.phase !== 'refused'
    ? { phase: 'refused', err: new ApiError(403, 'forbidden', 'the key lacks the scope to read events') } : busState);

  function detail(ev) {
    if (ev.run) {
      const r = ev.run;
      let d = `${r.run_id} #${r.seq} ${r.type}`;
      if (r.text) d += ' ' + JSON.stringify(r.text.length > 200 ? r.text.slice(0, 200) + '…' : r.text);
      if (r.error) d += ` ${r.error.code}: ${r.error.message}`;
      if (r.usage) d += ' usage ' + JSON.stringify(r.usage);
      return d;
    }
    if (ev.tunnel) {
      const t = ev.tunnel;
      return `${t.provider || ''} ${t.model || ''} ${t.path || ''} → ${t.status || ''} ${t.body_bytes} B ${t.duration_ms} ms${t.error ? ' ' + t.error : ''}`;
    }
    return [ev.reason, ev.remote].filter(Boolean).join(' · ');
  }

  listenBus((type, ev) => {
    if (type === 'bus.state') {
      showState(ev);
      return;
    }
    if (type === 'bus.resync' || ev.local || paused || !match(type)) return;
    rows.prepend(h('tr', { 'data-type': type }, h('td', {}, fmtTime(ev.time)), h('td', {}, type), h('td', {}, ev.node || ''), h('td', { class: 'sum' }, detail(ev))));
    n++;
    while (rows.childElementCount > 500) rows.lastElementChild.remove();
    count.textContent = `${n} received`;
  });
}

// typeMatcher reads the Events page's filter as the edge reads ?type=: a
// comma-separated list of types, a trailing "*" matching a prefix; empty
// keeps everything.
function typeMatcher(text) {
  const want = text.split(',').map((t) => t.trim()).filter(Boolean);
  if (!want.length) return () => true;
  return (type) => want.some((w) => w.endsWith('*') ? type.startsWith(w.slice(0, -1)) : type === w);
}

// ---------------------------------------------------------------- router

const PAGES = { nodes: pageNodes, runs: pageRuns, run: pageRun, start: pageStart, usage: pageUsage, events: pageEvents };

function route() {
  for (const fn of pageCleanup) fn();
  pageCleanup = [];
  const path = (location.hash.replace(/^#\/?/, '') || 'nodes').split('?')[0];
  const [page, ...rest] = path.split('/');
  const fn = PAGES[page] || pageNodes;
  for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('active', a.dataset.page === (page === 'run' ? 'runs' : page));
  const root = h('div', { 'data-page': page });
  main().replaceChildren(root);
  // A link with a malformed escape (#/run/%E0%A4) makes decodeURIComponent
  // throw, which left the page blank.
  let arg;
  try {
    arg = decodeURIComponent(rest.join('/'));
  } catch {
    root.append(h('h1', {}, 'Not found'), h('div', { class: 'error-box', id: 'not-found' },
      `No such page: "${rest.join('/')}" in this link is not a valid percent-encoded name.`));
    return;
  }
  Promise.resolve(fn(root, arg)).catch((err) => showError(root, err));
}

window.addEventListener('hashchange', route);
applyForbidden();
renderKeyState();
probeScopes().finally(() => {
  route();
  startBus();
});
