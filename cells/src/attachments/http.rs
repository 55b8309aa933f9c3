//! The local file store's HTTP listener: the signed URLs of
//! [`super::urls`] for the embedded default, so uploads and downloads work
//! with nothing but the binary. `PUT` stores a whole object (never over an
//! existing one) or one part of a multipart upload, taking exactly the
//! length the URL names and fsyncing before it answers; `GET` serves an
//! object with `Range`. Refusals are JSON with a stable reason.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use cellmesh_proto::reason::Reason;

use super::store::LocalFiles;
use crate::clock::Clock;

#[derive(Clone)]
struct Files {
    /// Region → its directory.
    stores: Arc<BTreeMap<String, LocalFiles>>,
    clock: Arc<dyn Clock>,
}

/// The router serving `/v1/files/<region>/<key>`.
pub fn router(stores: BTreeMap<String, LocalFiles>, clock: Arc<dyn Clock>) -> axum::Router {
    axum::Router::new()
        .route(
            "/v1/files/{*path}",
            axum::routing::put(put).get(get).head(get),
        )
        .with_state(Files {
            stores: Arc::new(stores),
            clock,
        })
}

fn refuse(status: StatusCode, reason: Reason, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "reason": reason.as_str(), "message": message.into() });
    (status, axum::Json(body)).into_response()
}

fn io_failure(e: std::io::Error) -> Response {
    tracing::warn!(error = %e, "file store");
    refuse(
        StatusCode::SERVICE_UNAVAILABLE,
        Reason::AttachmentStoreUnavailable,
        e.to_string(),
    )
}

/// The grant a signed URL carries, with the store and object key its path
/// names.
fn grant<'a>(
    files: &'a Files,
    method: &str,
    path: &'a str,
    query: Option<String>,
) -> Result<(super::urls::Grant, &'a LocalFiles, &'a str), Box<Response>> {
    let query = query.unwrap_or_default();
    let (region, key) = path.split_once('/').unwrap_or((path, ""));
    let Some(local) = files.stores.get(region) else {
        return Err(Box::new(refuse(
            StatusCode::NOT_FOUND,
            Reason::AttachmentNotFound,
            "no such store",
        )));
    };
    let grant = local
        .signer
        .verify(method, path, &query, files.clock.now_ms())
        .map_err(|refusal| {
            let status = match refusal {
                super::urls::Refusal::Malformed => StatusCode::BAD_REQUEST,
                _ => StatusCode::FORBIDDEN,
            };
            Box::new(refuse(
                status,
                refusal.reason(),
                "the URL is not valid for this request",
            ))
        })?;
    Ok((grant, local, key))
}

async fn put(
    State(files): State<Files>,
    Path(path): Path<String>,
    RawQuery(query): RawQuery,
    body: Body,
) -> Response {
    let (grant, local, key) = match grant(&files, "PUT", &path, query) {
        Ok(granted) => granted,
        Err(refused) => return *refused,
    };
    let (target, dir) = if grant.part == 0 {
        let object = local.object(key);
        if tokio::fs::try_exists(&object).await.unwrap_or(false) {
            return refuse(
                StatusCode::CONFLICT,
                Reason::AttachmentNotComplete,
                "the object is already stored",
            );
        }
        let parent = object.parent().map(|p| p.to_path_buf()).unwrap_or_default();
        (object, parent)
    } else {
        let dir = local.part_dir(key);
        if !tokio::fs::try_exists(&dir).await.unwrap_or(false) {
            return refuse(
                StatusCode::NOT_FOUND,
                Reason::AttachmentNotFound,
                "no such upload in progress",
            );
        }
        (local.part(key, grant.part), dir)
    };
    if let Err(e) = tokio::fs::create_dir_all(&dir).await {
        return io_failure(e);
    }
    let tmp = super::store::partial_beside(&target, "upload");
    match write_exactly(&tmp, body, grant.len).await {
        Ok(Ok(())) => {}
        Ok(Err(refused)) => {
            let _ = tokio::fs::remove_file(&tmp).await;
            return refused;
        }
        Err(e) => {
            let _ = tokio::fs::remove_file(&tmp).await;
            return io_failure(e);
        }
    }
    let placed = if grant.part == 0 {
        // Never over an object a retry already stored.
        let linked = tokio::fs::hard_link(&tmp, &target).await;
        let _ = tokio::fs::remove_file(&tmp).await;
        match linked {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return refuse(
                    StatusCode::CONFLICT,
                    Reason::AttachmentNotComplete,
                    "the object is already stored",
                );
            }
            other => other,
        }
    } else {
        tokio::fs::rename(&tmp, &target).await
    };
    if let Err(e) = placed.and(sync_dir(&dir).await) {
        return io_failure(e);
    }
    let etag = format!("\"{}-{}\"", grant.part, grant.len);
    (StatusCode::OK, [(header::ETAG, etag)]).into_response()
}

async fn sync_dir(dir: &std::path::Path) -> std::io::Result<()> {
    tokio::fs::File::open(dir).await?.sync_all().await
}

/// Writes the body to `path` if it is exactly `len` bytes, fsynced.
async fn write_exactly(
    path: &std::path::Path,
    body: Body,
    len: u64,
) -> std::io::Result<Result<(), Response>> {
    let mut file = tokio::fs::File::create(path).await?;
    let mut stream = body.into_data_stream();
    let mut written = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => {
                return Ok(Err(refuse(
                    StatusCode::BAD_REQUEST,
                    Reason::AttachmentSizeMismatch,
                    format!("the upload broke off: {e}"),
                )));
            }
        };
        written += chunk.len() as u64;
        if written > len {
            return Ok(Err(refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                Reason::AttachmentSizeMismatch,
                format!("more than the {len} bytes this URL takes"),
            )));
        }
        file.write_all(&chunk).await?;
    }
    if written != len {
        return Ok(Err(refuse(
            StatusCode::BAD_REQUEST,
            Reason::AttachmentSizeMismatch,
            format!("{written} bytes; this URL takes {len}"),
        )));
    }
    file.sync_all().await?;
    Ok(Ok(()))
}

async fn get(
    State(files): State<Files>,
    Path(path): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let (_, local, key) = match grant(&files, "GET", &path, query) {
        Ok(granted) => granted,
        Err(refused) => return *refused,
    };
    let mut file = match tokio::fs::File::open(local.object(key)).await {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return refuse(
                StatusCode::NOT_FOUND,
                Reason::AttachmentNotFound,
                "no such object",
            );
        }
        Err(e) => return io_failure(e),
    };
    let size = match file.metadata().await {
        Ok(meta) => meta.len(),
        Err(e) => return io_failure(e),
    };
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .map(|v| parse_range(v, size));
    let (status, start, end) = match range {
        None => (StatusCode::OK, 0, size),
        Some(Some((start, end))) => (StatusCode::PARTIAL_CONTENT, start, end),
        Some(None) => {
            return (
                StatusCode::RANGE_NOT_SATISFIABLE,
                [(header::CONTENT_RANGE, format!("bytes */{size}"))],
            )
                .into_response();
        }
    };
    if let Err(e) = file.seek(std::io::SeekFrom::Start(start)).await {
        return io_failure(e);
    }
    let stream = futures::stream::unfold((file, end - start), |(mut file, left)| async move {
        if left == 0 {
            return None;
        }
        let mut buf = vec![0u8; left.min(256 * 1024) as usize];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((
                    Ok::<_, std::io::Error>(bytes::Bytes::from(buf)),
                    (file, left - n as u64),
                ))
            }
            Err(e) => Some((Err(e), (file, 0))),
        }
    });
    let mut response = Response::builder()
        .status(status)
        .header(header::CONTENT_LENGTH, end - start)
        .header(header::ACCEPT_RANGES, "bytes");
    if status == StatusCode::PARTIAL_CONTENT {
        response = response.header(
            header::CONTENT_RANGE,
            format!("bytes {start}-{}/{size}", end - 1),
        );
    }
    response
        .body(Body::from_stream(stream))
        .unwrap_or_else(|e| {
            refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                Reason::StorageError,
                e.to_string(),
            )
        })
}

/// `bytes=a-b`, `bytes=a-` or `bytes=-n` as [start, end) within `size`;
/// `None`: not satisfiable.
fn parse_range(value: &str, size: u64) -> Option<(u64, u64)> {
    let spec = value.strip_prefix("bytes=")?.trim();
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (start, end) = if a.is_empty() {
        let n: u64 = b.parse().ok()?;
        (size.saturating_sub(n), size)
    } else {
        let start: u64 = a.parse().ok()?;
        let end = if b.is_empty() {
            size
        } else {
            b.parse::<u64>().ok()?.saturating_add(1).min(size)
        };
        (start, end)
    };
    (start < end).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::parse_range;

    #[test]
    fn ranges_resolve_within_the_object() {
        assert_eq!(parse_range("bytes=0-9", 100), Some((0, 10)));
        assert_eq!(parse_range("bytes=90-", 100), Some((90, 100)));
        assert_eq!(parse_range("bytes=-10", 100), Some((90, 100)));
        assert_eq!(parse_range("bytes=50-500", 100), Some((50, 100)));
        assert_eq!(parse_range("bytes=100-", 100), None);
        assert_eq!(parse_range("bytes=0-1,5-6", 100), None);
        assert_eq!(parse_range("items=0-1", 100), None);
    }
}
