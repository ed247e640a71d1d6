// Small helpers the e2e test files share (one copy here rather than one per file).
import crypto from 'node:crypto';

/** `prefix` and 8 random hex digits: a project, key or event name no other test run uses. */
export const uniq = (prefix) => `${prefix}-${crypto.randomBytes(4).toString('hex')}`;

/**
 * A response for an assertion message: its status and the start of its body (`max`
 * characters), with its headers when they are what the test is about.
 */
export const show = (res, { max = 500, headers = false } = {}) =>
  `${res.status}${headers ? ` ${JSON.stringify(res.headers)}` : ''} ${res.text?.slice(0, max)}`;
