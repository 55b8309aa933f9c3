//! Browsers at the edge: gRPC-Web (tonic-web) on the client port, and the
//! CORS rules that say which pages may call it. Only the origins the
//! config lists get the headers a browser needs to read an answer; a
//! preflight from any other origin is answered without them, so the
//! browser refuses the call.

use std::time::Duration;

use cellmesh_proto::config::ConfigError;
use http::{HeaderName, HeaderValue, Method};
use tower_http::cors::{AllowOrigin, CorsLayer};

/// Checks `web_origins`: `"*"`, or `http(s)://host[:port]` without a path.
pub fn check_origins(origins: &[String]) -> Result<(), ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        field: "web_origins",
        message,
    };
    for o in origins {
        if o == "*" {
            continue;
        }
        let rest = o
            .strip_prefix("https://")
            .or_else(|| o.strip_prefix("http://"))
            .ok_or_else(|| invalid(format!("{o:?} is not an origin (http:// or https://)")))?;
        if rest.is_empty() || rest.contains('/') || HeaderValue::from_str(o).is_err() {
            return Err(invalid(format!(
                "{o:?} is not an origin (scheme, host and port only)"
            )));
        }
    }
    Ok(())
}

/// The CORS layer for `origins` (see [`check_origins`]).
pub fn cors(origins: &[String]) -> CorsLayer {
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    let headers = |names: &[&'static str]| {
        names
            .iter()
            .map(|n| HeaderName::from_static(n))
            .collect::<Vec<_>>()
    };
    CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([Method::POST, Method::OPTIONS])
        .allow_headers(headers(&[
            "authorization",
            "content-type",
            "grpc-timeout",
            "x-grpc-web",
            "x-user-agent",
        ]))
        .expose_headers(headers(&[
            "grpc-status",
            "grpc-message",
            "grpc-status-details-bin",
        ]))
        .max_age(Duration::from_secs(24 * 3600))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_scheme_host_and_port() {
        let ok = |o: &[&str]| check_origins(&o.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(ok(&["*", "https://chat.example.com", "http://127.0.0.1:8080"]).is_ok());
        for bad in [
            "chat.example.com",
            "https://",
            "https://a.example/path",
            "ftp://a",
        ] {
            assert!(ok(&[bad]).is_err(), "{bad}");
        }
    }
}
