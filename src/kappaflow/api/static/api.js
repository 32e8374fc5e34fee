// Every request the dashboard makes goes through this module: `request` for JSON and
// `stream` for Server-Sent Events. Both stay on the service's own origin and send its
// cookies (credentials "same-origin"), so that a sign-in which sets an HttpOnly cookie
// covers them all; no token is ever put in a URL.

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** The answer to GET `path` (or another method in `options`) as JSON; ApiError else. */
export async function request(path, options = {}) {
  let response;
  try {
    response = await fetch(path, {
      credentials: "same-origin",
      cache: "no-store",
      ...options,
      headers: { Accept: "application/json", ...(options.headers || {}) },
    });
  } catch (err) {
    throw new ApiError(0, "", `the service did not answer: ${err.message}`);
  }
  const body = await response.json().catch(() => null);
  if (response.status === 401) {
    window.dispatchEvent(new CustomEvent("kf:sign-in-needed"));
  }
  if (!response.ok) {
    const message = body && body.error ? body.error : `HTTP ${response.status}`;
    throw new ApiError(response.status, body && body.code ? body.code : "", message);
  }
  return body;
}

/** True when an error means the service has no such endpoint (yet). */
export function isMissingEndpoint(err) {
  return err instanceof ApiError && err.status === 404 && err.code === "KF853";
}

/**
 * Server-Sent Events from `path`: `handlers` maps event names to functions of the parsed
 * data. The browser reconnects by itself and resumes with Last-Event-ID. `onFail` is
 * called once if the stream cannot be had (no such endpoint, or it closed for good).
 * Returns a function that closes the stream.
 */
export function stream(path, handlers, onFail) {
  const source = new EventSource(path, { withCredentials: true });
  let failed = false;
  for (const [name, handle] of Object.entries(handlers)) {
    source.addEventListener(name, (event) => {
      let data;
      try {
        data = JSON.parse(event.data);
      } catch {
        return;
      }
      handle(data, event.lastEventId);
    });
  }
  source.addEventListener("error", () => {
    // CONNECTING: the browser is reconnecting. CLOSED: it gave up (a 404, or an answer
    // that is not an event stream).
    if (source.readyState === EventSource.CLOSED && !failed) {
      failed = true;
      onFail();
    }
  });
  return () => source.close();
}

/** Sign in with an API token: the service answers with an HttpOnly session cookie. */
export function signIn(token) {
  return request("/v1/session", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ token }),
  });
}

export function signOut() {
  return request("/v1/session", { method: "DELETE" });
}

/** Who this session is, and whether the service needs a token; null where the service
 * has no sessions. */
export function session() {
  return request("/v1/session").catch((err) => {
    if (isMissingEndpoint(err)) return null;
    throw err;
  });
}
