// The Relay console: a small hash-routed page over /console/api.
// Memory text is untrusted input: it only ever reaches the DOM through dom.js (text nodes).
import { h, field, when, list } from './dom.js';
import { lineChart, stackedBars, pairedBars, timeLabel } from './charts.js';

const main = document.getElementById('main');
const statusBox = document.getElementById('status');
const alertBox = document.getElementById('alert');
const nav = document.getElementById('nav');
const who = document.getElementById('who');
const whoText = document.getElementById('who-text');
const confirmDialog = document.getElementById('confirm');

let session = null;
let facets = { audiences: ['all'], authors: {} };

class ApiError extends Error {
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details || {};
  }
}

async function api(method, path, body) {
  const headers = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (session && method !== 'GET') headers['X-CSRF-Token'] = session.csrf_token;
  const response = await fetch(`/console/api${path}`, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: 'same-origin',
    cache: 'no-store',
  });
  if (response.status === 204) return null;
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    const err = (data && data.error) || {};
    const problem = new ApiError(response.status, err.code || 'http_error', err.message || `HTTP ${response.status}`, err.details);
    if (response.status === 401 && path !== '/session') {
      session = null;
      showSignIn(problem.message);
    }
    throw problem;
  }
  return data;
}

// -- announcements -------------------------------------------------------------
function announce(message) {
  statusBox.textContent = '';
  // A fresh text node so screen readers announce a repeated message too.
  window.setTimeout(() => {
    statusBox.textContent = message;
  }, 30);
}

function showError(err, form) {
  const message = err instanceof ApiError ? `${err.code}: ${err.message}` : String(err.message || err);
  alertBox.textContent = message;
  alertBox.hidden = false;
  if (form) {
    clearFieldErrors(form);
    const name = (err.details && err.details.field) || (err.message || '').split(':')[0].split('.').pop();
    const control = name && form.querySelector(`[name="${CSS.escape(name)}"]`);
    // Repeated where the eye is: under the field it is about, else above the submit button;
    // the alert above is what is announced.
    const note = h('p', { class: 'form-error' }, message);
    const submit = form.querySelector('[type=submit]');
    if (control) {
      note.id = `${control.id || name}-error`;
      (control.closest('.field') || control).after(note);
      control.setAttribute('aria-invalid', 'true');
      control.setAttribute('aria-describedby', [control.getAttribute('aria-describedby'), note.id].filter(Boolean).join(' '));
      control.focus();
    } else if (submit) submit.before(note);
    else form.append(note);
  }
}

// A field marked by a refused submit stays marked only until the next answer.
function clearFieldErrors(root) {
  for (const note of root.querySelectorAll('.form-error')) {
    for (const el of root.querySelectorAll('[aria-describedby]')) {
      const rest = el.getAttribute('aria-describedby').split(' ').filter((id) => id && id !== note.id);
      if (rest.length) el.setAttribute('aria-describedby', rest.join(' '));
      else el.removeAttribute('aria-describedby');
    }
    note.remove();
  }
  for (const el of root.querySelectorAll('[aria-invalid]')) el.removeAttribute('aria-invalid');
}

function clearError() {
  alertBox.hidden = true;
  alertBox.textContent = '';
  clearFieldErrors(main);
}

function confirmAction(title, text, okLabel) {
  document.getElementById('confirm-title').textContent = title;
  document.getElementById('confirm-text').textContent = text;
  document.getElementById('confirm-ok').textContent = okLabel;
  confirmDialog.returnValue = 'cancel';
  confirmDialog.showModal();
  return new Promise((resolve) => {
    confirmDialog.addEventListener('close', () => resolve(confirmDialog.returnValue === 'ok'), { once: true });
  });
}

function render(title, ...nodes) {
  clearError();
  const heading = h('h1', { tabindex: '-1', id: 'page-title' }, title);
  main.replaceChildren(heading, ...nodes.flat().filter((n) => n !== null && n !== undefined && n !== false));
  document.title = `${title} · Relay console`;
  heading.focus();
}

function badge(text) {
  return h('span', { class: `badge badge-${text}` }, text);
}

function memoryLink(id, label) {
  return h('a', { href: `#/memory/${encodeURIComponent(id)}` }, label || id);
}

function excerpt(text, size = 70) {
  const flat = String(text || '').replace(/\s+/g, ' ').trim();
  return flat.length > size ? `${flat.slice(0, size - 1)}…` : flat;
}

function pre(text, attrs = {}) {
  return h('pre', attrs, text);
}

function button(label, onclick, attrs = {}) {
  return h('button', { type: 'button', onclick, ...attrs }, label);
}

function formValues(form) {
  const out = {};
  for (const el of form.elements) {
    if (!el.name) continue;
    out[el.name] = el.type === 'checkbox' ? el.checked : el.value;
  }
  return out;
}

function submitting(form, handler) {
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const submit = form.querySelector('[type=submit]');
    if (submit) submit.disabled = true;
    try {
      clearError();
      await handler(formValues(form));
    } catch (err) {
      showError(err, form);
    } finally {
      if (submit) submit.disabled = false;
    }
  });
  return form;
}

// -- sign in -------------------------------------------------------------------
function showSignIn(message) {
  nav.hidden = true;
  who.hidden = true;
  const key = h('input', { type: 'password', name: 'key', autocomplete: 'off', required: true, spellcheck: 'false' });
  const form = h(
    'form',
    { class: 'card narrow', 'aria-labelledby': 'page-title' },
    h('p', {}, 'Sign in with a Relay API key. Admin keys manage the whole organisation; other keys see what their roles allow.'),
    field('API key', key, 'relay_<key id>_<secret>. It is kept in an HttpOnly session cookie for this console only.'),
    h('button', { type: 'submit' }, 'Sign in'),
  );
  render('Sign in', form);
  if (message) showError(new ApiError(401, 'unauthorized', message));
  submitting(form, async (values) => {
    const answer = await api('POST', '/session', { key: values.key });
    key.value = '';
    await start(answer);
  });
}

async function start(info) {
  session = info;
  whoText.textContent = `${info.org.name} · key ${info.key.name || info.key.id} (${(info.key.scopes || []).join(', ')})`;
  who.hidden = false;
  nav.hidden = false;
  for (const el of nav.querySelectorAll('[data-needs]')) {
    el.hidden = !session.can[el.dataset.needs];
  }
  facets = await api('GET', '/facets');
  if (!location.hash.startsWith('#/')) location.hash = '#/memories';
  else route();
}

document.getElementById('sign-out').addEventListener('click', async () => {
  try {
    await api('DELETE', '/session');
  } finally {
    session = null;
    history.replaceState(null, '', '#/memories');
    showSignIn();
    announce('Signed out');
  }
});

document.querySelector('.skip').addEventListener('click', (event) => {
  event.preventDefault();
  (document.getElementById('page-title') || main).focus();
});

// -- routing -------------------------------------------------------------------
const routes = [
  [/^\/memories$/, pageMemories],
  [/^\/memory\/([^/]+)$/, (q, id) => pageMemory(q, decodeURIComponent(id))],
  [/^\/new$/, pageNew],
  [/^\/search$/, pageSearch],
  [/^\/preview$/, pagePreview],
  [/^\/keys$/, pageKeys],
  [/^\/health$/, pageHealth],
];

async function route() {
  if (!session) return;
  const [path, query] = location.hash.slice(1).split('?');
  const params = new URLSearchParams(query || '');
  for (const link of nav.querySelectorAll('a')) {
    const current = link.getAttribute('href').slice(1) === path || (path.startsWith('/memory/') && link.getAttribute('href') === '#/memories');
    if (current) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  for (const [pattern, page] of routes) {
    const match = pattern.exec(path);
    if (match) {
      try {
        await page(params, ...match.slice(1));
      } catch (err) {
        if (err instanceof ApiError && err.status === 401) return;
        render('Something went wrong', h('p', {}, 'The console could not load this page.'));
        showError(err);
      }
      return;
    }
  }
  render('Not found', h('p', {}, 'No such console page. '), h('a', { href: '#/memories' }, 'Back to memories'));
}

window.addEventListener('hashchange', route);

// -- memories list ---------------------------------------------------------------
const STATUS_LABELS = {
  any: 'any',
  active: 'active',
  expiring: 'expiring soon',
  expired: 'expired (past valid_until)',
  superseded: 'superseded',
  pinned: 'pinned',
};

function select(name, options, value) {
  return h(
    'select',
    { name },
    options.map(([v, label]) => h('option', { value: v, selected: v === value ? true : null }, label)),
  );
}

// The filters live in the route (#/memories?q=...), so a reload or a shared link keeps them.
const MEMORY_FILTERS = ['q', 'source_prefix', 'tag', 'audience', 'author', 'status', 'expiring_days'];

// Follow `hash`; one equal to the current route would fire no hashchange, so show it anew.
function follow(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

async function pageMemories(params) {
  // `source`: links made before the filter matched a prefix
  const value = (name) => params.get(name) || (name === 'source_prefix' && params.get('source')) || '';
  const authors = Object.entries(facets.authors || {});
  const form = h(
    'form',
    { class: 'filters', role: 'search', 'aria-label': 'Filter memories' },
    field('Text', h('input', { name: 'q', type: 'search', value: value('q'), placeholder: 'words in title or text' })),
    field('Source starts with', h('input', { name: 'source_prefix', value: value('source_prefix') })),
    field('Tag', h('input', { name: 'tag', value: value('tag') })),
    field('Audience', select('audience', [['', 'any'], ...facets.audiences.map((a) => [a, a])], value('audience'))),
    field(
      'Author',
      authors.length
        ? select('author', [['', 'any'], ...authors.map(([id, name]) => [id, `${name} (${id})`])], value('author'))
        : h('input', { name: 'author', value: value('author') }),
    ),
    field('Status', select('status', Object.entries(STATUS_LABELS), value('status') || 'any')),
    field('Expiring within (days)', h('input', { name: 'expiring_days', type: 'number', min: '1', max: '3650', value: value('expiring_days') || '7' })),
    h('div', { class: 'field actions' }, h('button', { type: 'submit' }, 'Apply filters')),
  );
  submitting(form, async (values) => {
    const query = new URLSearchParams(Object.entries(values).filter(([, v]) => v.trim() !== ''));
    // Unchanged filters too: the list starts again from the newest change.
    follow(`#/memories?${query}`);
  });
  const tbody = h('tbody', {});
  const table = h(
    'table',
    { class: 'memories' },
    h('caption', {}, 'Memories, most recently changed first'),
    h(
      'thead',
      {},
      h('tr', {}, ['Title', 'Source', 'Audiences', 'Tags', 'Author', 'Updated', 'Valid until', 'Status'].map((c) => h('th', { scope: 'col' }, c))),
    ),
    tbody,
  );
  // One page at a time: a second click while one loads would ask for the same cursor again
  // and list its memories twice.
  const more = button('Load more', async () => {
    more.disabled = true;
    try {
      clearError();
      await load();
    } catch (err) {
      showError(err);
    } finally {
      more.disabled = false;
    }
  }, { hidden: true });
  const count = h('p', { class: 'hint', 'aria-live': 'polite' });
  const actions = session.can.write ? h('p', {}, h('a', { href: '#/new', class: 'button' }, 'New memory')) : null;
  render('Memories', actions, form, count, table, more);
  let cursor = null;
  let shown = 0;
  async function load() {
    const query = new URLSearchParams();
    for (const name of MEMORY_FILTERS) {
      if (value(name)) query.set(name, value(name));
    }
    query.set('limit', '50');
    if (cursor) query.set('cursor', cursor);
    const page = await api('GET', `/memories?${query}`);
    for (const m of page.items) {
      tbody.append(
        h(
          'tr',
          {},
          h('td', {}, memoryLink(m.id, m.title || excerpt(m.body)), h('div', { class: 'hint' }, m.id)),
          h('td', {}, m.source || ''),
          h('td', {}, m.audiences.join(', ')),
          h('td', {}, m.tags.join(', ')),
          h('td', {}, m.author_name || m.author || ''),
          h('td', {}, when(m.updated_at)),
          h('td', {}, when(m.valid_until)),
          h('td', {}, m.status.map(badge)),
        ),
      );
    }
    shown += page.items.length;
    cursor = page.next_cursor;
    more.hidden = !cursor;
    count.textContent = `${shown} memor${shown === 1 ? 'y' : 'ies'} shown${cursor ? ' (more available)' : ''}.`;
  }
  try {
    await load();
  } catch (err) {
    // A filter the server refused (too long, too many words) is told by its field.
    if (!(err instanceof ApiError && err.status === 401)) showError(err, form);
  }
}

// -- one memory --------------------------------------------------------------------
function memoryForm(memory, onSave, saveLabel) {
  const m = memory || { audiences: ['all'], tags: [], supersedes: [] };
  const quick = (label, ms) =>
    button(label, () => {
      validUntil.value = ms === null ? '' : new Date(Date.now() + ms).toISOString().replace(/\.\d+Z$/, 'Z');
      validUntil.focus();
    });
  const validUntil = h('input', { name: 'valid_until', value: m.valid_until || '', spellcheck: 'false' });
  const form = h(
    'form',
    { class: 'card memory-form' },
    memory ? null : field('ID (optional)', h('input', { name: 'id', spellcheck: 'false' }), 'Leave empty for a generated id.'),
    field('Title', h('input', { name: 'title', value: m.title || '' })),
    field('Body', h('textarea', { name: 'body', rows: '8', required: true }, m.body || ''), 'The fact, plain text or Markdown. Secrets are refused.'),
    field('Source', h('input', { name: 'source', value: m.source || '', spellcheck: 'false' }), 'Provenance, like team/infra or workspace/memories/migrations.'),
    field('Audiences', h('input', { name: 'audiences', value: m.audiences.join(', '), spellcheck: 'false' }), `Comma-separated roles; known: ${facets.audiences.join(', ')}.`),
    field('Tags', h('input', { name: 'tags', value: m.tags.join(', ') }), 'Comma-separated.'),
    field('Valid until', validUntil, 'ISO 8601 (2026-12-31 or 2026-12-31T18:00:00Z), in the future; empty for no end.'),
    h('div', { class: 'quick', role: 'group', 'aria-label': 'Set valid until' }, quick('In 1 minute', 60e3), quick('In 1 day', 864e5), quick('In 30 days', 30 * 864e5), quick('No end', null)),
    field('Supersedes', h('input', { name: 'supersedes', value: m.supersedes.join(', '), spellcheck: 'false' }), `Comma-separated ids of memories this one replaces.${m.supersedes_withheld ? ` Its links to ${m.supersedes_withheld} this key cannot read stay.` : ''}`),
    h('div', { class: 'field check' }, h('input', { type: 'checkbox', name: 'pinned', id: 'pinned', checked: m.pinned }), h('label', { for: 'pinned' }, 'Pinned (part of the team profile at session start)')),
    h('button', { type: 'submit' }, saveLabel),
  );
  return submitting(form, async (v) => {
    const payload = {
      body: v.body,
      title: v.title.trim() || null,
      source: v.source.trim() || null,
      audiences: list(v.audiences),
      tags: list(v.tags),
      valid_until: v.valid_until.trim() || null,
      supersedes: list(v.supersedes),
      pinned: v.pinned,
    };
    if (!memory && v.id.trim()) payload.id = v.id.trim();
    await onSave(payload);
  });
}

async function pageNew() {
  if (!session.can.write) {
    render('New memory', h('p', {}, 'This key cannot write memories (it lacks memory:write).'));
    return;
  }
  render(
    'New memory',
    memoryForm(null, async (payload) => {
      const saved = await api('POST', '/memories', payload);
      keepOutOfSight(saved);
      location.hash = `#/memory/${encodeURIComponent(saved.id)}`;
      announce([`Created memory ${saved.id}`, ...(saved.warnings || [])].join('; '));
    }, 'Create memory'),
  );
}

// Memories this page saved where its key cannot read them (the write's `warnings`): their
// page would only say "not found", as if the write had failed.
const outOfSight = new Map();

function keepOutOfSight(saved) {
  if (saved.warnings && saved.warnings.length) outOfSight.set(saved.id, saved);
  else outOfSight.delete(saved.id);
}

// Links to memories this key cannot read are counted, never named (docs/http-api.md).
function hiddenLinks(m) {
  const n = m.supersedes_withheld || 0;
  return n ? `(and ${n} ${n === 1 ? 'memory' : 'memories'} this key cannot read)` : '';
}

function describe(m) {
  const rows = [
    ['ID', h('code', {}, m.id)],
    ['Revision', String(m.revision)],
    ['Status', m.status.map(badge)],
    ['Source', m.source || '—'],
    ['Audiences', m.audiences.join(', ')],
    ['Tags', m.tags.join(', ') || '—'],
    ['Author', m.author_name ? `${m.author_name} (${m.author})` : m.author || '—'],
    ['Created', when(m.created_at)],
    ['Updated', when(m.updated_at)],
    ['Valid until', when(m.valid_until) || 'no end'],
    ['Supersedes', m.supersedes.length || m.supersedes_withheld ? [m.supersedes.map((id) => [memoryLink(id), ' ']), hiddenLinks(m)] : '—'],
    ['Superseded by', m.superseded_by ? memoryLink(m.superseded_by) : '—'],
    ['Pinned', m.pinned ? 'yes' : 'no'],
  ];
  return h('dl', { class: 'meta' }, rows.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
}

async function pageMemory(params, id) {
  let m;
  try {
    m = await api('GET', `/memories/${encodeURIComponent(id)}`);
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) return pageGone(id, err);
    throw err;
  }
  const history = await api('GET', `/memories/${encodeURIComponent(id)}/revisions`);
  const editSlot = h('div', {});
  const actions = [];
  if (session.can.write) {
    actions.push(
      button('Edit', () => {
        if (editSlot.firstChild) {
          editSlot.replaceChildren();
          return;
        }
        editSlot.replaceChildren(
          h('h2', {}, 'Edit (saves a new revision)'),
          memoryForm(m, async (payload) => {
            const saved = await api('PATCH', `/memories/${encodeURIComponent(m.id)}`, { ...payload, expected_revision: m.revision });
            keepOutOfSight(saved);
            announce([`Saved revision ${saved.revision}`, ...(saved.warnings || [])].join('; '));
            await pageMemory(params, m.id);
          }, 'Save new revision'),
        );
        editSlot.querySelector('textarea').focus();
      }, { id: 'edit-button' }),
      button('Delete…', async () => {
        const ok = await confirmAction('Delete this memory?', `Memory ${m.id} will be removed from search at once; its history keeps a tombstone, not the text. This cannot be undone.`, 'Delete memory');
        if (!ok) {
          announce('Delete cancelled');
          return;
        }
        try {
          // At the revision shown: an edit that landed since is not deleted unseen (409).
          await api('DELETE', `/memories/${encodeURIComponent(m.id)}?expected_revision=${m.revision}`);
          location.hash = '#/memories';
          announce(`Deleted memory ${m.id}`);
        } catch (err) {
          showError(err);
        }
      }, { class: 'danger', id: 'delete-button' }),
    );
  }
  render(
    m.title || m.id,
    h('div', { class: 'toolbar' }, actions),
    describe(m),
    h('h2', {}, 'Body'),
    pre(m.body, { class: 'memory-body', id: 'memory-body' }),
    editSlot,
    historySection(m, history.items),
  );
}

// A memory this key cannot open: saved out of its sight, deleted (its history, tombstones
// and all, stays readable, as `relay history` shows it), or not there at all.
async function pageGone(id, err) {
  const back = h('p', {}, h('a', { href: '#/memories' }, 'Back to memories'));
  const saved = outOfSight.get(id);
  if (saved) {
    render(`Memory ${id} saved`, h('p', { id: 'write-warning', class: 'notice' }, `Saved as revision ${saved.revision}, but ${saved.warnings.join('; ')}.`), back);
    return;
  }
  let history = { items: [] };
  try {
    history = await api('GET', `/memories/${encodeURIComponent(id)}/revisions`);
  } catch (e) {
    if (!(e instanceof ApiError && e.status === 404)) throw e;
  }
  const last = history.items[history.items.length - 1];
  if (last && last.action === 'delete') {
    const by = last.author_name || last.author || 'an unknown key';
    render(`Memory ${id} deleted`, h('p', { id: 'deleted' }, `Deleted at ${when(last.recorded_at)} by ${by}. Its history keeps a tombstone, not the text.`), back, historySection({ id }, history.items));
    return;
  }
  render('Memory not found', h('p', { id: 'not-found' }, `No memory ${id} is visible to this key.`), back);
  showError(err);
}

function historySection(m, items) {
  const diffSlot = h('div', { id: 'diff', 'aria-live': 'polite' });
  const latest = items.length ? items[items.length - 1].revision : 1;
  const previous = items.length > 1 ? items[items.length - 2].revision : latest;
  const radio = (name, r, checked) =>
    h('input', { type: 'radio', name, value: String(r.revision), checked, 'aria-label': `${name === 'from' ? 'Compare from' : 'Compare to'} revision ${r.revision}` });
  const table = h(
    'table',
    { class: 'history' },
    h('caption', {}, `Revision history (${items.length})`),
    h('thead', {}, h('tr', {}, ['From', 'To', 'Revision', 'Action', 'Recorded', 'Author', 'Title'].map((c) => h('th', { scope: 'col' }, c)))),
    h(
      'tbody',
      {},
      items.map((r) =>
        h(
          'tr',
          {},
          h('td', {}, radio('from', r, r.revision === previous)),
          h('td', {}, radio('to', r, r.revision === latest)),
          h('td', {}, String(r.revision)),
          h('td', {}, r.action),
          h('td', {}, when(r.recorded_at)),
          h('td', {}, r.author_name || r.author || ''),
          h('td', {}, r.withheld ? '(withheld: written for audiences this key cannot read)' : r.body === null ? '(tombstone: text removed)' : r.title || ''),
        ),
      ),
    ),
  );
  const form = h('form', { class: 'compare' }, table, h('button', { type: 'submit' }, 'Compare revisions'));
  submitting(form, async () => {
    const from = form.querySelector('input[name=from]:checked').value;
    const to = form.querySelector('input[name=to]:checked').value;
    const d = await api('GET', `/memories/${encodeURIComponent(m.id)}/diff?from=${from}&to=${to}`);
    diffSlot.replaceChildren(renderDiff(d));
    diffSlot.querySelector('h3').focus();
  });
  return h('section', { 'aria-labelledby': 'history-title' }, h('h2', { id: 'history-title' }, 'History'), form, diffSlot);
}

function renderDiff(d) {
  const changed = d.fields.filter((f) => f.changed);
  const same = d.fields.filter((f) => !f.changed).map((f) => f.field);
  return h(
    'div',
    { class: 'diff-view' },
    h('h3', { tabindex: '-1' }, `Revision ${d.from.revision} → ${d.to.revision}`),
    changed.length ? null : h('p', {}, 'No field changed.'),
    changed.map((f) =>
      h(
        'div',
        { class: 'diff-field' },
        h('h4', {}, f.field),
        h(
          'div',
          { class: 'diff', role: 'list' },
          f.lines.map((line) => {
            const tag = line.op === '+' ? 'ins' : line.op === '-' ? 'del' : 'span';
            const label = line.op === '+' ? 'added: ' : line.op === '-' ? 'removed: ' : '';
            return h('div', { role: 'listitem', class: `line op-${line.op === ' ' ? 'same' : line.op === '+' ? 'add' : 'del'}` },
              h('span', { class: 'sr-only' }, label),
              h('span', { class: 'mark', 'aria-hidden': 'true' }, line.op),
              h(tag, {}, line.text));
          }),
        ),
      ),
    ),
    same.length ? h('p', { class: 'hint' }, `Unchanged: ${same.join(', ')}.`) : null,
  );
}

// -- search ---------------------------------------------------------------------------
async function pageSearch(params) {
  const query = h('input', { name: 'query', type: 'search', required: true, value: params.get('q') || '' });
  const form = h(
    'form',
    { class: 'card', role: 'search', 'aria-label': 'Search memories' },
    field('Query', query, 'Runs the recall pipeline under this key\'s roles: the same candidates, ranking and threshold as the hook\'s searches.'),
    field('Mode', select('mode', [['hybrid', 'hybrid (lexical + semantic)'], ['lexical', 'full-text (lexical)'], ['semantic', 'semantic']], params.get('mode') || 'hybrid')),
    field('Results', h('input', { name: 'k', type: 'number', min: '1', max: '12', value: params.get('k') || '10' })),
    h('button', { type: 'submit' }, 'Search'),
  );
  const out = h('div', { id: 'search-results', 'aria-live': 'polite' });
  render('Search', form, out);
  // The search lives in the route (#/search?q=...): submitting follows it, and the page
  // it renders runs it, so a reload or a shared link shows the same results.
  submitting(form, async (v) => follow(`#/search?${new URLSearchParams({ q: v.query, mode: v.mode, k: v.k })}`));
  if (!params.get('q')) return;
  try {
    out.replaceChildren(...searchResults(await api('POST', '/search', { query: params.get('q'), mode: params.get('mode') || 'hybrid', k: Number(params.get('k') || 10) })));
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 401)) showError(err, form);
  }
}

function searchResults(r) {
  return [
    h('p', { class: 'hint' }, `${r.results.length} result(s) · stages ${r.stages.join(', ') || 'none'} · ${r.took_ms} ms${r.degraded ? ' · degraded (semantic stage skipped)' : ''}`),
    r.results.length
      ? h(
          'ol',
          { class: 'results' },
          r.results.map((hit) =>
            h(
              'li',
              {},
              h('div', {}, memoryLink(hit.id, hit.title || hit.id)),
              h('div', { class: 'hint' }, `score ${hit.score} · revision ${hit.revision} · ${hit.source || 'no source'} · passage ${hit.passage}`),
              h('p', { class: 'passage' }, hit.text),
            ),
          ),
        )
      : h('p', {}, 'Nothing relevant: the answer is empty, as recall would answer.'),
  ];
}

// -- what the agent would see -------------------------------------------------------------
const SKIP_REASONS = {
  short_prompt: 'the prompt is shorter than the hook\'s minimum length (15 characters), so the hook never searches',
  no_keywords: 'the prompt has no keywords left after dropping filler words, so the hook never searches',
};

async function pagePreview(params) {
  const keyOptions = [['', `this key (${session.key.name || session.key.id})`]];
  if (session.can.admin) {
    const keys = await api('GET', '/keys');
    for (const k of keys.items) {
      if (k.status === 'active' && k.id !== session.key.id) keyOptions.push([k.id, `${k.name} (${k.id}; roles ${k.roles.join(', ') || 'none'})`]);
    }
  }
  const prompt = h('textarea', { name: 'prompt', rows: '4', required: true }, params.get('prompt') || '');
  const form = h(
    'form',
    { class: 'card' },
    h('p', {}, 'Shows exactly what the recall hook would inject for this prompt as the first prompt of a new session (empty ledger), with the hook\'s own gate, validation and packing code and its default limits.'),
    field('Prompt', prompt),
    field('As key', select('key_id', keyOptions, ''), 'Recall uses the key\'s own roles; an admin key sees no more than its roles in recall.'),
    field('Max records', h('input', { name: 'max_records', type: 'number', min: '1', max: '20', value: String(session.hook.max_records) })),
    field('Max tokens', h('input', { name: 'max_tokens', type: 'number', min: String(session.hook.max_tokens_min), max: String(session.hook.max_tokens_max), value: String(session.hook.max_tokens) })),
    field('Min score', h('input', { name: 'min_score', type: 'number', min: '0', max: '1', step: '0.01', value: String(session.hook.min_score) }), 'The hook\'s min_score knob: results the server scored below it are dropped (0: the server\'s threshold only).'),
    h('button', { type: 'submit' }, 'Show what the agent would see'),
  );
  const out = h('div', { id: 'preview-result', 'aria-live': 'polite' });
  render('What would the agent see?', form, out);
  submitting(form, async (v) => {
    const r = await api('POST', '/preview', {
      prompt: v.prompt,
      key_id: v.key_id || null,
      max_records: Number(v.max_records),
      max_tokens: Number(v.max_tokens),
      min_score: Number(v.min_score),
    });
    out.replaceChildren(...previewResult(r, Number(v.max_tokens)));
  });
}

function previewResult(r, maxTokens) {
  const parts = [];
  if (r.outcome === 'hit') {
    parts.push(
      h('p', { id: 'preview-outcome', class: 'outcome outcome-hit' }, `The hook would inject ${r.injected.length} record(s), ${r.tokens} tokens (limit ${maxTokens}).`),
      h('h2', {}, 'additionalContext'),
      pre(r.context, { id: 'preview-context', class: 'context' }),
      h(
        'table',
        {},
        h('caption', {}, 'Records injected'),
        h('thead', {}, h('tr', {}, ['Memory', 'Revision', 'Source'].map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', {}, r.injected.map((x) => h('tr', {}, h('td', {}, memoryLink(x.id)), h('td', {}, String(x.revision)), h('td', {}, x.source)))),
      ),
      h('details', {}, h('summary', {}, 'Hook stdout, byte for byte'), pre(r.stdout, { id: 'preview-stdout' })),
    );
  } else if (r.outcome === 'skipped') {
    parts.push(h('p', { id: 'preview-outcome', class: 'outcome' }, `Nothing injected: ${SKIP_REASONS[r.reason] || r.reason} (outcome skipped, reason ${r.reason}).`));
  } else if (r.outcome === 'no_match') {
    parts.push(h('p', { id: 'preview-outcome', class: 'outcome' }, 'Nothing injected: no memory passed the relevance threshold (outcome no_match, which is healthy). Stdout would be empty.'));
  } else {
    parts.push(h('p', { id: 'preview-outcome', class: 'outcome outcome-bad' }, `Nothing injected: outcome ${r.outcome} (${r.reason}).`));
  }
  if (r.request) parts.push(h('details', {}, h('summary', {}, 'Request the hook sends'), pre(JSON.stringify(r.request, null, 2))));
  if (r.server) parts.push(h('details', {}, h('summary', {}, `Server answer (stages ${r.server.stages.join(', ') || 'none'}, ${r.server.took_ms} ms)`), pre(JSON.stringify(r.server, null, 2))));
  return parts;
}

// -- keys -------------------------------------------------------------------------------
async function pageKeys() {
  if (!session.can.admin) {
    render('API keys', h('p', {}, 'Only an admin key can manage keys.'));
    return;
  }
  const secretSlot = h('div', { id: 'new-secret', 'aria-live': 'polite' });
  const tbody = h('tbody', {});
  const scopes = ['memory:read', 'memory:write', 'admin'];
  const form = h(
    'form',
    { class: 'card' },
    h('h2', {}, 'Create a key'),
    field('Name', h('input', { name: 'name', required: true })),
    h(
      'fieldset',
      {},
      h('legend', {}, 'Scopes'),
      scopes.map((scope) => h('div', { class: 'check' }, h('input', { type: 'checkbox', name: `scope:${scope}`, id: `scope-${scope}`, checked: scope === 'memory:read' }), h('label', { for: `scope-${scope}` }, scope))),
    ),
    field('Roles', h('input', { name: 'roles', spellcheck: 'false' }), 'Comma-separated audiences this key may read, besides "all".'),
    field('Expires at', h('input', { name: 'expires_at', spellcheck: 'false' }), 'Optional, ISO 8601.'),
    h('button', { type: 'submit' }, 'Create key'),
  );
  submitting(form, async (v) => {
    const body = {
      name: v.name,
      scopes: scopes.filter((scope) => v[`scope:${scope}`]),
      roles: list(v.roles),
    };
    if (v.expires_at.trim()) body.expires_at = v.expires_at.trim();
    const key = await api('POST', '/keys', body);
    form.reset();
    const copy = button('Copy to clipboard', async () => {
      try {
        await navigator.clipboard.writeText(key.secret);
        announce('Secret copied');
      } catch {
        announce('Copy failed: select the secret and copy it by hand');
      }
    });
    secretSlot.replaceChildren(
      h(
        'div',
        { class: 'card secret', role: 'region', 'aria-label': 'New key secret' },
        h('h2', { tabindex: '-1' }, `Key ${key.name} created`),
        h('p', {}, 'This secret is shown once and never again. Store it now.'),
        pre(key.secret, { id: 'secret-value' }),
        copy,
        ' ',
        button('Done, hide it', () => secretSlot.replaceChildren()),
      ),
    );
    secretSlot.querySelector('h2').focus();
    await load();
  });
  async function load() {
    const keys = await api('GET', '/keys');
    tbody.replaceChildren(
      ...keys.items.map((k) =>
        h(
          'tr',
          { 'data-key': k.id },
          h('td', {}, k.name),
          h('td', {}, h('code', {}, k.id)),
          h('td', {}, k.scopes.join(', ')),
          h('td', {}, k.roles.join(', ') || '—'),
          h('td', {}, when(k.created_at)),
          h('td', {}, when(k.expires_at) || '—'),
          h('td', {}, badge(k.status)),
          h(
            'td',
            {},
            k.status === 'active'
              ? button('Revoke…', async () => {
                  const own = k.id === session.key.id;
                  const ok = await confirmAction(`Revoke key ${k.name}?`, `Key ${k.id} stops working at once, everywhere${own ? ' — it is the key this console is signed in with, so you will be signed out' : ''}. This cannot be undone.`, 'Revoke key');
                  if (!ok) return announce('Revoke cancelled');
                  try {
                    await api('DELETE', `/keys/${encodeURIComponent(k.id)}`);
                    announce(`Revoked key ${k.name}`);
                    if (own) return showSignIn('You revoked the key this console was signed in with.');
                    await load();
                  } catch (err) {
                    showError(err);
                  }
                }, { class: 'danger', 'aria-label': `Revoke key ${k.name}` })
              : '',
          ),
        ),
      ),
    );
  }
  render(
    'API keys',
    secretSlot,
    h(
      'table',
      { class: 'keys' },
      h('caption', {}, 'Keys of this organisation'),
      h('thead', {}, h('tr', {}, ['Name', 'ID', 'Scopes', 'Roles', 'Created', 'Expires', 'Status', ''].map((c) => h('th', { scope: 'col' }, c)))),
      tbody,
    ),
    form,
  );
  await load();
}

// -- health -----------------------------------------------------------------------------
async function pageHealth(params) {
  const hours = Number(params.get('hours') || '24');
  const d = await api('GET', `/health?hours=${hours}`);
  const s = d.searches;
  const span = s.until - s.since;
  const labels = s.buckets.map((b) => timeLabel(b.start, span));
  const pct = (x) => (x === null || x === undefined ? 'n/a' : `${(x * 100).toFixed(1)}%`);
  const windowForm = h(
    'form',
    { class: 'filters', 'aria-label': 'Time window' },
    field('Window', select('hours', [['1', 'last hour'], ['24', 'last 24 hours'], ['168', 'last 7 days']], String(hours))),
    h('div', { class: 'field actions' }, h('button', { type: 'submit' }, 'Show')),
  );
  submitting(windowForm, async (v) => {
    location.hash = `#/health?hours=${v.hours}`;
  });
  const t = s.total;
  const deadline = s.deadline_ms;
  const summary = h(
    'dl',
    { class: 'meta summary' },
    [
      ['Searches', String(t.searches)],
      ['Hits / no match', `${t.hit} / ${t.no_match}`],
      ['Degraded (semantic skipped)', String(t.degraded)],
      ['Cache hit rate', pct(t.cache_hit_rate)],
      ['Latency p50 / p95 / p99', `${t.p50} / ${t.p95} / ${t.p99} ms`],
      ['Deadline asked (median)', deadline ? `${deadline} ms` : 'n/a'],
      ['Memories', String(d.memories)],
      ['Recorded since', when(d.recorded_since)],
    ].map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]),
  );
  const col = (name) => s.buckets.map((b) => b[name]);
  const rate = s.buckets.map((b) => (b.searches ? +((b.cached / b.searches) * 100).toFixed(1) : null));
  const memoryTable = (caption, items, extra) =>
    h(
      'table',
      {},
      h('caption', {}, caption),
      h('thead', {}, h('tr', {}, ['Memory', 'Source', extra[0]].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, items.length ? items.map((m) => h('tr', {}, h('td', {}, memoryLink(m.id, m.title || m.id)), h('td', {}, m.source || ''), h('td', {}, extra[1](m)))) : h('tr', {}, h('td', { colspan: '3' }, 'None.'))),
    );
  const nodes = [
    h('p', { class: 'hint' }, 'Server-side recall searches of this organisation (API and MCP; console searches are not counted), kept in this server process since it started. On several replicas each shows its own share.'),
    windowForm,
    summary,
    lineChart({
      title: 'Search latency (ms)',
      description: `p50, p95 and p99 server search time per interval, with the requested deadline (${deadline ?? 'n/a'} ms) drawn dashed.`,
      labels,
      unit: '',
      series: [
        { name: 'p50', cls: 's1', values: col('p50').map((v, i) => (s.buckets[i].searches ? v : null)) },
        { name: 'p95', cls: 's2', values: col('p95').map((v, i) => (s.buckets[i].searches ? v : null)) },
        { name: 'p99', cls: 's3', values: col('p99').map((v, i) => (s.buckets[i].searches ? v : null)) },
      ],
      threshold: deadline ? { value: deadline, label: `deadline ${deadline} ms` } : null,
    }),
    stackedBars({
      title: 'Search outcomes',
      description: 'Searches per interval by outcome: hit (something relevant) or no match (healthy empty answer).',
      labels,
      series: [
        { name: 'hit', cls: 's1', values: col('hit') },
        { name: 'no match', cls: 's4', values: col('no_match') },
      ],
    }),
    lineChart({
      title: 'Cache hit rate (%)',
      description: `Share of searches answered from the result cache per interval; overall ${pct(t.cache_hit_rate)}.`,
      labels,
      series: [{ name: 'cache hits %', cls: 's2', values: rate }],
    }),
    h('h2', {}, 'Recall'),
    memoryTable('Most recalled', d.most_recalled, ['Times returned', (m) => String(m.recalls)]),
    memoryTable(`Never recalled (${d.never_recalled.total} live memories)`, d.never_recalled.items, ['Created', (m) => when(m.created_at)]),
    memoryTable(`Past valid_until (${d.past_valid_until.total})`, d.past_valid_until.items, ['Valid until', (m) => when(m.valid_until)]),
  ];
  if (d.developers) {
    const devs = d.developers;
    nodes.push(h('h2', {}, 'Hook installs (developers who send their outcomes)'));
    if (!devs.length) {
      nodes.push(h('p', {}, 'No developer has sent hook outcomes yet. A developer opts in with: relay stats --send (or --as "alice laptop"), which posts the hook\'s aggregated outcomes, never prompts or paths.'));
    } else {
      nodes.push(
        pairedBars({
          title: 'Current streaks per developer',
          description: 'Trailing runs of unauthorized (401/403: a revoked or wrong key) and of timeout/unavailable outcomes in each developer\'s latest report. Any unauthorized streak, or an unavailable streak at the alert line, means a broken install.',
          // One name sent from two keys is two rows: the key tells them apart.
          names: devs.map((x) => (devs.filter((y) => y.developer === x.developer).length > 1 ? `${x.developer} (${x.key_name || x.key_id})` : x.developer)),
          series: [
            { name: 'unauthorized', cls: 's3', values: devs.map((x) => x.latest.unauthorized_streak.length) },
            { name: 'unavailable', cls: 's2', values: devs.map((x) => x.latest.unavailable_streak.length) },
          ],
          alert: 3,
        }),
        h(
          'table',
          { class: 'developers' },
          h('caption', {}, 'Latest report per developer'),
          h('thead', {}, h('tr', {}, ['Developer', 'Key', 'Status', 'Unauthorized streak', 'Unavailable streak', 'Hits / searches', 'Hook p95', 'Reported'].map((c) => h('th', { scope: 'col' }, c)))),
          h(
            'tbody',
            {},
            devs.map((x) => {
              const o = x.latest.outcomes;
              const searched = ['hit', 'no_match', 'timeout', 'unavailable', 'unauthorized', 'invalid_response'].reduce((a, k) => a + (o[k] || 0), 0);
              return h(
                'tr',
                {},
                h('th', { scope: 'row' }, x.developer),
                h('td', {}, x.key_name || x.key_id),
                h('td', {}, x.broken.length ? x.broken.map((b) => badge(`broken: ${b}`)) : badge('ok')),
                h('td', {}, `${x.latest.unauthorized_streak.length}${x.latest.unauthorized_streak.since ? ` since ${when(x.latest.unauthorized_streak.since)}` : ''}`),
                h('td', {}, `${x.latest.unavailable_streak.length}${x.latest.unavailable_streak.since ? ` since ${when(x.latest.unavailable_streak.since)}` : ''}`),
                h('td', {}, `${o.hit || 0} / ${searched}`),
                h('td', {}, x.latest.hook_ms.p95 !== undefined ? `${x.latest.hook_ms.p95} ms` : ''),
                h('td', {}, when(new Date(x.latest.received_at * 1000).toISOString().replace(/\.\d+Z$/, 'Z'))),
              );
            }),
          ),
        ),
      );
    }
  }
  render('Health', ...nodes);
}

// -- boot ---------------------------------------------------------------------------------
(async () => {
  try {
    const info = await api('GET', '/session');
    await start(info);
  } catch (err) {
    if (!(err instanceof ApiError) || err.status !== 401) showSignIn(String(err.message || err));
    else showSignIn();
  }
})();
