/** Where the decision endpoint is and what to do when it cannot be reached. */
export interface Options {
  /** The decision listener, e.g. "http://127.0.0.1:7392" (`decision.listen`). */
  url: string;
  /** How long to wait for a decision, in milliseconds (default 250). */
  timeoutMs?: number;
  /** The answer when the limiter cannot be reached: "allow" (default) or "deny" (503). */
  onError?: 'allow' | 'deny';
  /** The fetch to use (default: the global one). */
  fetch?: typeof fetch;
  /**
   * Method override headers to pass on besides X-HTTP-Method-Override, X-HTTP-Method and
   * X-Method-Override: any others the limiter's `methods.override_headers` names. Naming one the
   * client sets itself (X-Forwarded-For, Forwarded, X-Real-IP, X-Forwarded-Method/-Uri/-Host/
   * -Proto, X-Original-Method/-URI, Host) throws a TypeError.
   */
  overrideHeaders?: string[];
  /**
   * When the limiter cannot be reached, at most one warning per this many milliseconds (default
   * 60000), with how many requests were let through (or refused) since the last one; 0 warns
   * every time.
   */
  warnIntervalMs?: number;
  /** Where the warning goes (default: console.warn). */
  warn?: (line: string) => void;
  /**
   * Called for every request let through unchecked because the limiter could not be reached
   * (onError "allow"): count them, page someone. A hook that throws is ignored.
   */
  onFailOpen?: (error: Error, request: Question) => void;
}

export interface MiddlewareOptions extends Options {
  /** Told each time the limiter cannot be reached (default: nothing; the warning says it). */
  onLimiterError?: (error: Error) => void;
}

/** The request to decide on. Header names are lower-case. */
export interface Question {
  /** The method the request came with. */
  method: string;
  /** The method the app routes it as, when an override already changed it. */
  routedMethod?: string;
  /**
   * The path and query the function routes on, percent-encoded (visible ASCII, starting with
   * `/`). The limiter meters exactly this path and refuses one that is not its own canonical
   * form (`//x`, `/a/../b`, `%72`): pass what your router reads, not the raw target.
   */
  url: string;
  /**
   * The client's address as something the client cannot write determined it: the connection's
   * peer, or the entry the one proxy in front appended to X-Forwarded-For (the middleware sends
   * `req.ip`, under the app's `trust proxy`). Never the header's leftmost entry.
   */
  ip?: string;
  headers?: Record<string, string | string[] | undefined>;
}

export interface Decision {
  allowed: boolean;
  /**
   * 200 when allowed; otherwise the status to answer with (429; 400 for a path the limiter will
   * not meter as given, decided here without asking when it is not visible ASCII starting with
   * `/`; 501 for a method it does not serve; 503 while the limiter's store cannot answer and
   * it refuses meanwhile (`store-unavailable`, whatever onError says); or 503 with onError
   * "deny" when the limiter cannot be reached).
   */
  status: number;
  /** RateLimit, RateLimit-Policy, X-RateLimit-*, and Retry-After (or Allow) on a refusal. */
  headers: Record<string, string>;
  /** The problem document to answer with when refused. */
  body: string;
  /** Why the limiter could not be reached, when it could not. */
  error?: Error;
}

/** Ask whether one request may pass (plain fetch: serverless functions, any framework). */
export function check(opts: Options, req: Question): Promise<Decision>;

/** Express 4/5 middleware. */
export function fleetLimiter(
  opts: MiddlewareOptions,
): (req: any, res: any, next: (err?: unknown) => void) => Promise<void>;
