//! The HTTP client (reqwest over rustls) and the one-line errors a user sees when a server
//! cannot be reached or refuses a request.
//!
//! A kept-alive connection can be closed by the server just as a request goes out on it (its
//! idle timeout, or llama.cpp closing after a stream): the request then fails with "connection
//! closed before message completed" although the server never answered it. So only a GET — the
//! endpoints that change nothing (`/metrics`, `/props`, `/v1/models`) — rides a pooled
//! connection, and one that the server closed before a complete response head is sent once more
//! on a connection opened for it. A POST (a generation, a tokenisation) always opens a
//! connection of its own: it never meets a pooled connection's close, and is never sent twice,
//! so a server never acts on one request twice.

use std::sync::Arc;
#[cfg(test)]
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;

use super::frames::error_text;
use crate::backend::{BackendError, BackendResult, KeySource};
use deltascope_protocol::ErrorKind;

/// A client bound to one server.
#[derive(Clone)]
pub struct Http {
    /// Kept-alive connections: GETs.
    pub client: reqwest::Client,
    /// A connection opened for each request: POSTs, and the one retry of a GET whose pooled
    /// connection was closed under it.
    fresh: reqwest::Client,
    /// GETs sent a second time (tests).
    #[cfg(test)]
    retried: Arc<AtomicU64>,
    /// `http://host:port`, without a trailing slash or `/v1`.
    pub base: String,
    pub key: Option<(String, KeySource)>,
    /// Bounds connecting and reading the small JSON endpoints.
    pub timeout: Duration,
}

/// What a request is, so it can be built twice (the retry).
#[derive(Clone, Copy)]
pub enum Ask<'a> {
    Get,
    /// A POST with a JSON body.
    Post(&'a Value),
}

impl Http {
    pub fn new(url: &str, key: Option<(String, KeySource)>, timeout: Duration) -> BackendResult<Self> {
        Http::build(url, key, timeout, None)
    }

    fn build(
        url: &str,
        key: Option<(String, KeySource)>,
        timeout: Duration,
        resolver: Option<Arc<dyn reqwest::dns::Resolve>>,
    ) -> BackendResult<Self> {
        // rustls needs a process-wide crypto provider; ring is built in (a second install
        // attempt just reports that one is there).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let base = normalise(url)?;
        let builder = || {
            let b = reqwest::Client::builder()
                .connect_timeout(timeout)
                .user_agent(concat!("deltascope/", env!("CARGO_PKG_VERSION")));
            match &resolver {
                Some(r) => b.dns_resolver(r.clone()),
                None => b,
            }
        };
        let fail =
            |e: reqwest::Error| BackendError::new(ErrorKind::Internal, format!("cannot build the HTTP client: {e}"));
        let client = builder().build().map_err(fail)?;
        let fresh = builder().pool_max_idle_per_host(0).build().map_err(fail)?;
        Ok(Http {
            client,
            fresh,
            #[cfg(test)]
            retried: Arc::new(AtomicU64::new(0)),
            base,
            key,
            timeout,
        })
    }

    /// A client whose host names resolve through `resolver` (tests: a DNS failure without
    /// contacting a resolver).
    #[cfg(test)]
    pub fn with_resolver<R: reqwest::dns::Resolve + 'static>(url: &str, resolver: Arc<R>) -> Self {
        Http::build(url, None, Duration::from_secs(5), Some(resolver)).expect("test client")
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Where the API key came from, for 401/403 messages.
    pub fn key_hint(&self) -> String {
        match &self.key {
            Some((_, src)) => format!("the key from {src} was refused"),
            None => "no API key was sent; pass --api-key or set DELTASCOPE_API_KEY / OPENAI_API_KEY".into(),
        }
    }

    /// GETs sent a second time because a kept-alive connection closed under them.
    #[cfg(test)]
    pub fn retried(&self) -> u64 {
        self.retried.load(Ordering::SeqCst)
    }

    fn builder(
        &self,
        client: &reqwest::Client,
        ask: Ask,
        path: &str,
        timeout: Option<Duration>,
    ) -> reqwest::RequestBuilder {
        let rb = match ask {
            Ask::Get => client.get(self.url(path)),
            Ask::Post(body) => client.post(self.url(path)).json(body),
        };
        let rb = match timeout {
            Some(t) => rb.timeout(t),
            None => rb,
        };
        match &self.key {
            Some((k, _)) => rb.bearer_auth(k),
            None => rb,
        }
    }

    /// Sends a request (see the module's note): a POST on a connection of its own, once; a GET
    /// on a kept-alive one, and once more on a new connection when the server closed that one
    /// before answering. `timeout` bounds the whole request.
    pub async fn send(
        &self,
        ask: Ask<'_>,
        path: &str,
        timeout: Option<Duration>,
    ) -> reqwest::Result<reqwest::Response> {
        if let Ask::Post(_) = ask {
            return self.builder(&self.fresh, ask, path, timeout).send().await;
        }
        match self.builder(&self.client, ask, path, timeout).send().await {
            Err(e) if closed_unanswered(&e) => {
                tracing::info!(
                    "{}: the kept-alive connection was closed before an answer ({e}); sending once more on a new one",
                    self.url(path)
                );
                #[cfg(test)]
                self.retried.fetch_add(1, Ordering::SeqCst);
                self.builder(&self.fresh, ask, path, timeout).send().await
            }
            r => r,
        }
    }

    /// GET a JSON endpoint that must work (errors are the user's).
    pub async fn get_json(&self, path: &str) -> BackendResult<Value> {
        let resp =
            self.send(Ask::Get, path, Some(self.timeout)).await.map_err(|e| transport_error(&self.url(path), &e))?;
        json_body(path, resp, &self.key_hint()).await
    }

    /// GET a JSON endpoint a server may not have (`None` for any failure).
    pub async fn try_get_json(&self, path: &str) -> Option<Value> {
        let resp = self.send(Ask::Get, path, Some(self.timeout)).await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        resp.json().await.ok()
    }

    /// GET a text endpoint a server may not have (`None` for any failure).
    pub async fn try_get_text(&self, path: &str) -> Option<String> {
        let resp = self.send(Ask::Get, path, Some(self.timeout)).await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        resp.text().await.ok()
    }
}

/// Whether a request failed because the server closed the connection before a complete
/// response head (hyper's "connection closed before message completed").
fn closed_unanswered(e: &reqwest::Error) -> bool {
    let mut src: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = src {
        if s.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_incomplete_message) {
            return true;
        }
        src = s.source();
    }
    false
}

/// `http://host:8080/v1/` → `http://host:8080`; anything not http(s) is refused.
fn normalise(url: &str) -> BackendResult<String> {
    let u = url.trim().trim_end_matches('/');
    let u = u.strip_suffix("/v1").unwrap_or(u);
    if !(u.starts_with("http://") || u.starts_with("https://")) {
        return Err(BackendError::invalid(format!(
            "--server {url}: expected an http:// or https:// URL, e.g. http://127.0.0.1:8080"
        )));
    }
    Ok(u.to_string())
}

/// A request that never got an HTTP answer, as one line with the likely cause.
pub fn transport_error(url: &str, e: &reqwest::Error) -> BackendError {
    let mut chain = vec![];
    let mut src: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = src {
        let text = s.to_string();
        if !chain.iter().any(|c: &String| c.contains(&text)) {
            chain.push(text);
        }
        src = s.source();
    }
    let detail = chain.last().cloned().unwrap_or_default();
    let all = chain.join(": ").to_lowercase();
    let why = if all.contains("connection refused") {
        "connection refused (is the server running, and on this port?)".to_string()
    } else if all.contains("dns") || all.contains("lookup") || all.contains("name or service not known") {
        format!("cannot resolve the host name ({detail})")
    } else if all.contains("certificate")
        || all.contains("tls")
        || all.contains("handshake")
        || all.contains("invalidcontenttype")
        || all.contains("corrupt message")
    {
        format!("TLS failed ({detail}); a plain-HTTP server needs an http:// URL")
    } else if e.is_timeout() && url.starts_with("https://") {
        "timed out connecting (a plain-HTTP server does not answer a TLS handshake: try http://)".to_string()
    } else if e.is_timeout() {
        "timed out connecting".to_string()
    } else {
        detail
    };
    BackendError::new(ErrorKind::Unavailable, format!("cannot reach {url}: {why}"))
}

/// Turns a non-2xx answer into the user's error: 401/403 name the key's source, 404 for a
/// model lists what the server serves, others carry the server's own message.
pub async fn check_status(
    path: &str,
    resp: reqwest::Response,
    key_hint: &str,
    models: &[String],
) -> BackendResult<reqwest::Response> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let url = resp.url().to_string();
    let body = resp.text().await.unwrap_or_default();
    let message = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| {
            v.get("error")
                .map(error_text)
                .or_else(|| v.get("detail").map(error_text))
                .or_else(|| v.get("message").map(error_text))
        })
        .unwrap_or_else(|| body.chars().take(200).collect::<String>().replace(['\n', '\r'], " "));
    let code = status.as_u16();
    let (kind, text) = match code {
        401 | 403 => (ErrorKind::InvalidRequest, format!("{url}: HTTP {code}: {message}; {key_hint}")),
        404 if !models.is_empty() => (
            ErrorKind::InvalidRequest,
            format!("{url}: HTTP 404: {message} (the server serves: {})", models.join(", ")),
        ),
        404 => (
            ErrorKind::Unavailable,
            format!("{url}: HTTP 404: {message} (is {path} an OpenAI-compatible endpoint here?)"),
        ),
        400..=499 => {
            let lower = message.to_lowercase();
            // OpenAI's error code (vLLM and deltascope serve send it), else the words.
            let overflow = body.contains("\"context_length_exceeded\"")
                || lower.contains("context")
                    && ["exceed", "too long", "maximum", "longer than"].iter().any(|w| lower.contains(w));
            let kind = if overflow { ErrorKind::ContextOverflow } else { ErrorKind::InvalidRequest };
            (kind, format!("{url}: HTTP {code}: {message}"))
        }
        _ => (ErrorKind::Unavailable, format!("{url}: HTTP {code}: {message}")),
    };
    Err(BackendError::new(kind, text))
}

/// Reads a response that must be JSON, naming what came instead.
async fn json_body(path: &str, resp: reqwest::Response, key_hint: &str) -> BackendResult<Value> {
    let resp = check_status(path, resp, key_hint, &[]).await?;
    let ctype =
        resp.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let url = resp.url().to_string();
    let bytes = resp.bytes().await.map_err(|e| BackendError::new(ErrorKind::Unavailable, format!("{url}: {e}")))?;
    serde_json::from_slice(&bytes).map_err(|_| {
        let first = String::from_utf8_lossy(&bytes[..bytes.len().min(80)]).replace(['\n', '\r'], " ");
        BackendError::new(
            ErrorKind::Unavailable,
            format!("{url} answered {ctype} that is not JSON (\"{first}…\"): this URL does not look like an OpenAI-compatible API"),
        )
    })
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::{Ask, Http};

    /// Reads one request (head and a Content-Length body) and returns its first line; `None`
    /// when the peer closed first.
    fn read_request(c: &mut TcpStream) -> Option<String> {
        let mut buf = vec![];
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            if c.read(&mut byte).ok()? == 0 {
                return None;
            }
            buf.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&buf).to_string();
        let len = head
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)))
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        c.read_exact(&mut body).ok()?;
        Some(head.lines().next().unwrap_or_default().to_string())
    }

    fn answer(c: &mut TcpStream, body: &str) {
        let text = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        c.write_all(text.as_bytes()).unwrap();
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    /// A server that keeps a connection alive after its first answer, then closes it when the
    /// next request arrives on it without answering (its idle timeout crossing the request on
    /// the wire): the GET is sent once more, on a new connection, and answered there.
    #[test]
    fn a_get_on_a_kept_alive_connection_closed_under_it_is_sent_once_more() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(vec![]));
        let log = seen.clone();
        let server = std::thread::spawn(move || {
            let (mut first, _) = listener.accept().unwrap();
            log.lock().unwrap().push(format!("conn 1: {}", read_request(&mut first).unwrap()));
            answer(&mut first, r#"{"n": 1}"#);
            log.lock().unwrap().push(format!("conn 1: {}", read_request(&mut first).unwrap()));
            drop(first);
            let (mut second, _) = listener.accept().unwrap();
            log.lock().unwrap().push(format!("conn 2: {}", read_request(&mut second).unwrap()));
            answer(&mut second, r#"{"n": 2}"#);
        });
        let http = Http::new(&url, None, Duration::from_secs(5)).unwrap();
        let rt = runtime();
        assert_eq!(rt.block_on(http.get_json("/first")).unwrap()["n"], 1);
        assert_eq!(rt.block_on(http.get_json("/second")).unwrap()["n"], 2);
        server.join().unwrap();
        assert_eq!(http.retried(), 1);
        assert_eq!(
            *seen.lock().unwrap(),
            ["conn 1: GET /first HTTP/1.1", "conn 1: GET /second HTTP/1.1", "conn 2: GET /second HTTP/1.1"]
        );
    }

    /// A POST never rides a kept-alive connection (after a GET left one open, it opens its own),
    /// and a POST whose connection the server closed without an answer is not sent again (the
    /// server may have acted on it): the error reaches the caller.
    #[test]
    fn a_post_opens_its_own_connection_and_is_never_sent_twice() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (mut kept, _) = listener.accept().unwrap();
            let get = read_request(&mut kept);
            answer(&mut kept, r#"{"n": 1}"#);
            // The POST arrives on a connection of its own; the kept one stays idle.
            let (mut c, _) = listener.accept().unwrap();
            let post = read_request(&mut c);
            drop(c);
            // Any second attempt would arrive within this window.
            listener.set_nonblocking(true).unwrap();
            let until = std::time::Instant::now() + Duration::from_millis(800);
            let mut again = 0;
            while std::time::Instant::now() < until {
                if listener.accept().is_ok() {
                    again += 1;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            drop(kept);
            (get, post, again)
        });
        let http = Http::new(&url, None, Duration::from_secs(5)).unwrap();
        let rt = runtime();
        assert_eq!(rt.block_on(http.get_json("/props")).unwrap()["n"], 1);
        let body = serde_json::json!({"q": 1});
        let sent = rt.block_on(http.send(Ask::Post(&body), "/v1/chat/completions", None));
        assert!(sent.is_err(), "{sent:?}");
        let (get, post, again) = server.join().unwrap();
        assert_eq!(get.as_deref(), Some("GET /props HTTP/1.1"));
        assert_eq!(post.as_deref(), Some("POST /v1/chat/completions HTTP/1.1"));
        assert_eq!((again, http.retried()), (0, 0), "sent once only");
    }
}
