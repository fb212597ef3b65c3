//! The HTTP client (reqwest over rustls) and the one-line errors a user sees when a server
//! cannot be reached or refuses a request.

use std::time::Duration;

use serde_json::Value;

use super::frames::error_text;
use crate::backend::{BackendError, BackendResult, KeySource};
use crate::generation::ErrorKind;

/// A client bound to one server.
#[derive(Clone)]
pub struct Http {
    pub client: reqwest::Client,
    /// `http://host:port`, without a trailing slash or `/v1`.
    pub base: String,
    pub key: Option<(String, KeySource)>,
    /// Bounds connecting and reading the small JSON endpoints.
    pub timeout: Duration,
}

impl Http {
    pub fn new(url: &str, key: Option<(String, KeySource)>, timeout: Duration) -> BackendResult<Self> {
        // rustls needs a process-wide crypto provider; ring is built in (a second install
        // attempt just reports that one is there).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let base = normalise(url)?;
        let client = reqwest::Client::builder()
            .connect_timeout(timeout)
            .user_agent(concat!("deltascope/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| BackendError::new(ErrorKind::Internal, format!("cannot build the HTTP client: {e}")))?;
        Ok(Http { client, base, key, timeout })
    }

    /// A client whose host names resolve through `resolver` (tests: a DNS failure without
    /// contacting a resolver).
    #[cfg(test)]
    pub fn with_resolver<R: reqwest::dns::Resolve + 'static>(url: &str, resolver: std::sync::Arc<R>) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder().dns_resolver(resolver).build().expect("test client");
        Http { client, base: normalise(url).expect("test url"), key: None, timeout: Duration::from_secs(5) }
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

    pub fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.authorise(self.client.get(self.url(path)).timeout(self.timeout))
    }

    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.authorise(self.client.post(self.url(path)))
    }

    fn authorise(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.key {
            Some((k, _)) => rb.bearer_auth(k),
            None => rb,
        }
    }

    /// GET a JSON endpoint that must work (errors are the user's).
    pub async fn get_json(&self, path: &str) -> BackendResult<Value> {
        let resp = self.get(path).send().await.map_err(|e| transport_error(&self.url(path), &e))?;
        json_body(path, resp, &self.key_hint()).await
    }

    /// GET a JSON endpoint a server may not have (`None` for any failure).
    pub async fn try_get_json(&self, path: &str) -> Option<Value> {
        let resp = self.get(path).send().await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        resp.json().await.ok()
    }

    /// GET a text endpoint a server may not have (`None` for any failure). Tried twice: a
    /// server that closes a kept-alive connection right after a stream (llama.cpp) fails the
    /// first request sent on it.
    pub async fn try_get_text(&self, path: &str) -> Option<String> {
        let resp = match self.get(path).send().await {
            Ok(r) => r,
            Err(_) => self.get(path).send().await.ok()?,
        };
        if !resp.status().is_success() {
            return None;
        }
        resp.text().await.ok()
    }
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
