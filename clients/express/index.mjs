// The ES module entry of @fleet-limiter/express: `import { fleetLimiter, check } from
// '@fleet-limiter/express'`. It re-exports the CommonJS module (index.js), so an app that loads
// the package both ways gets one copy of it.
import client from './index.js';

export const { fleetLimiter, check } = client;
export default client;
