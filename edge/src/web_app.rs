//! The web chat app, served by the edge on its client port: a `GET` (or
//! `HEAD`) is answered with the app's static files, every other request
//! goes on to gRPC / gRPC-Web. The files are the app built into the binary
//! (`clients/web`'s bundle at build time), or a directory the operator
//! names (`web_root`). Off unless `web_app` is set.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use tonic::body::Body;
use tower::{Layer, Service};

mod built {
    include!(concat!(env!("OUT_DIR"), "/web_app.rs"));
}

/// Where the app's files come from.
#[derive(Clone, Debug)]
pub enum Files {
    /// The app built into this binary.
    BuiltIn,
    /// A directory holding `index.html` and what it loads.
    Dir(PathBuf),
}

impl Files {
    /// Whether this binary was built with the app.
    pub fn built_in_present() -> bool {
        !built::FILES.is_empty()
    }

    /// The bytes of `name` (a path under the app, no `..`).
    fn read(&self, name: &str) -> Option<Bytes> {
        match self {
            Files::BuiltIn => built::FILES
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, b)| Bytes::from_static(b)),
            Files::Dir(dir) => std::fs::read(dir.join(name)).ok().map(Bytes::from),
        }
    }
}

/// `/`, `/index.html`, `/app.js`: the file's name; `None` for a path that
/// could leave the app's directory.
fn file_name(path: &str) -> Option<&str> {
    let name = path.strip_prefix('/').unwrap_or(path);
    let name = if name.is_empty() { "index.html" } else { name };
    let safe = name
        .split('/')
        .all(|part| !part.is_empty() && !part.starts_with('.'))
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b));
    safe.then_some(name)
}

fn content_type(name: &str) -> &'static str {
    match name.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("json" | "map") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        _ => "application/octet-stream",
    }
}

fn answer(status: StatusCode, kind: &'static str, body: Bytes, head: bool) -> Response<Body> {
    let len = body.len();
    let body = if head {
        Body::empty()
    } else {
        Body::new(http_body_util::Full::new(body))
    };
    let mut r = Response::new(body);
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    // Small files, rebuilt with each release: always revalidated.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'self'; connect-src *; img-src 'self' blob: data:"),
    );
    r
}

fn serve(files: &Files, request: &Request<impl Sized>) -> Response<Body> {
    let head = request.method() == Method::HEAD;
    let Some(name) = file_name(request.uri().path()) else {
        return answer(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"not found\n"),
            head,
        );
    };
    match files.read(name) {
        Some(bytes) => answer(StatusCode::OK, content_type(name), bytes, head),
        None if name == "index.html" => answer(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"the web app is not in this build: run `npm run build` in clients/web, then build cellmesh again (or set web_root)\n"),
            head,
        ),
        None => answer(StatusCode::NOT_FOUND, "text/plain; charset=utf-8", Bytes::from_static(b"not found\n"), head),
    }
}

/// Serves the app's files to `GET`/`HEAD` when `files` is set.
#[derive(Clone)]
pub struct AppLayer {
    files: Option<Arc<Files>>,
}

impl AppLayer {
    pub fn new(files: Option<Files>) -> Self {
        Self {
            files: files.map(Arc::new),
        }
    }
}

impl<S> Layer<S> for AppLayer {
    type Service = App<S>;
    fn layer(&self, inner: S) -> App<S> {
        App {
            inner,
            files: self.files.clone(),
        }
    }
}

#[derive(Clone)]
pub struct App<S> {
    inner: S,
    files: Option<Arc<Files>>,
}

impl<S, B> Service<Request<B>> for App<S>
where
    S: Service<Request<B>, Response = Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if let Some(files) = &self.files
            && matches!(*request.method(), Method::GET | Method::HEAD)
        {
            let response = serve(files, &request);
            return Box::pin(async move { Ok(response) });
        }
        Box::pin(self.inner.call(request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_inside_the_app_are_served() {
        assert_eq!(file_name("/"), Some("index.html"));
        assert_eq!(file_name("/app.js"), Some("app.js"));
        assert_eq!(file_name("/assets/a.css"), Some("assets/a.css"));
        for bad in [
            "/../etc/passwd",
            "/a/../../x",
            "/.env",
            "//x",
            "/a%2e%2e/b",
            "/a\\b",
        ] {
            assert_eq!(file_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_directory_serves_its_files_and_nothing_outside() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("index.html"), "<p>hi</p>").unwrap();
        let files = Files::Dir(dir.path().to_path_buf());
        let get = |p: &str| serve(&files, &Request::get(p).body(()).unwrap());
        let ok = get("/");
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(
            ok.headers()[header::CONTENT_TYPE],
            "text/html; charset=utf-8"
        );
        assert_eq!(get("/missing.js").status(), StatusCode::NOT_FOUND);
        assert_eq!(get("/../index.html").status(), StatusCode::NOT_FOUND);
    }
}
