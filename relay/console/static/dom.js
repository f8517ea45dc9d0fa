// Building the DOM without ever parsing HTML: every piece of data becomes a text node
// or an attribute value; no string is ever parsed as markup.

const SVG_NS = 'http://www.w3.org/2000/svg';

function fill(el, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith('on') && typeof value === 'function') {
      el.addEventListener(name.slice(2), value);
    } else if (name === 'value' && el instanceof HTMLSelectElement) {
      el.value = String(value);
    } else if (name === 'checked') {
      el.defaultChecked = Boolean(value); // so form.reset() returns to it
      el.checked = Boolean(value);
    } else {
      el.setAttribute(name, value === true ? '' : String(value));
    }
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** An HTML element: h('a', {href: '#/x'}, 'text', otherNode). Strings are always text. */
export function h(tag, attrs = {}, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

/** An SVG element, same rules. */
export function s(tag, attrs = {}, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), attrs, children);
}

let uid = 0;
/** A fresh id for label/aria wiring. */
export function nextId(prefix = 'f') {
  uid += 1;
  return `${prefix}-${uid}`;
}

/** A labelled form control with an optional hint tied to it by aria-describedby. */
export function field(label, control, hint) {
  const id = control.id || nextId();
  control.id = id;
  const parts = [h('label', { for: id }, label), control];
  if (hint) {
    const hintId = `${id}-hint`;
    control.setAttribute('aria-describedby', hintId);
    parts.push(h('p', { class: 'hint', id: hintId }, hint));
  }
  return h('div', { class: 'field' }, parts);
}

export function when(iso) {
  if (!iso) return '';
  return iso.replace('T', ' ').replace('Z', ' UTC');
}

export function list(text) {
  return String(text || '')
    .split(',')
    .map((part) => part.trim())
    .filter(Boolean);
}
