// Types of the ES module entry (index.mjs): the same as the CommonJS entry's.
export * from './index.js';
import * as client from './index.js';
export default client;
