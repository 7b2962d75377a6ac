// The REST API as the dashboard calls it: the signed-in key on every request, and Mint's one
// error body ({"error": {"type", "message", "param"}}) turned into an ApiError.

const KEY = "mint.apiKey";

export class ApiError extends Error {
  constructor(status, type, message, param, body) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.type = type;
    this.param = param;
    this.body = body;
  }

  // The message as people read it: what went wrong, and the field it concerns.
  describe() {
    const where = this.param ? ` (${this.param})` : "";
    return `${this.message}${where}`;
  }
}

export function storedKey() {
  return sessionStorage.getItem(KEY);
}

export function storeKey(key) {
  sessionStorage.setItem(KEY, key);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY);
}

// Listeners told when the API refuses the key (revoked, expired), so the page can sign out.
const unauthenticatedListeners = [];
export function onUnauthenticated(listener) {
  unauthenticatedListeners.push(listener);
}

function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null && value !== "") search.set(name, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

export async function request(method, path, { params, body, key } = {}) {
  const secret = key ?? storedKey();
  const headers = { Accept: "application/json" };
  if (secret) headers.Authorization = `Bearer ${secret}`;
  // A FormData body (a file upload) goes as multipart, with the boundary the browser sets.
  const multipart = body instanceof FormData;
  if (body !== undefined && !multipart) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path + query(params), {
      method,
      headers,
      body: body === undefined || multipart ? body : JSON.stringify(body),
    });
  } catch (failure) {
    throw new ApiError(0, "network_error", `The API could not be reached: ${failure.message}`, null, null);
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) {
    const detail = data && data.error ? data.error : {};
    const error = new ApiError(
      response.status,
      detail.type || "http_error",
      detail.message || `${method} ${path} answered ${response.status} ${response.statusText}`,
      detail.param || null,
      data,
    );
    if (response.status === 401 && key === undefined) unauthenticatedListeners.forEach((listener) => listener(error));
    throw error;
  }
  return data;
}

export const get = (path, params) => request("GET", path, { params });
export const post = (path, body) => request("POST", path, { body: body ?? {} });
export const patch = (path, body) => request("PATCH", path, { body: body ?? {} });
// A multipart upload: `form` is a FormData with the file and its fields.
export const upload = (path, form) => request("POST", path, { body: form });

// Every item of a paged list (`after=<last_id>`), up to `most` items.
export async function all(path, params = {}, most = 1000) {
  const items = [];
  let after;
  for (;;) {
    const page = await get(path, { ...params, limit: 100, after });
    items.push(...page.data);
    if (!page.has_more || items.length >= most || !page.last_id) return items.slice(0, most);
    after = page.last_id;
  }
}
