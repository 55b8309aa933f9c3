//! `chat send --file` and `chat download`: a person's uploads (with a
//! progress bar, resumed when the same command runs again) and downloads
//! (each file checked by its SHA-256 before it takes its name).

use std::path::{Path, PathBuf};

use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::{Direction, MessageType, PullRequest};

use crate::connect::{Authed, call_error};
use crate::files::Files;

/// Uploads `paths` into `conversation`: the message type (an image alone
/// is an image) and the uploads' ids.
pub(super) async fn upload_all(
    files: &mut Files,
    conversation: u64,
    paths: &[PathBuf],
) -> anyhow::Result<(MessageType, Vec<u64>)> {
    let mut ids = Vec::new();
    let mut kind = MessageType::File;
    for path in paths {
        let content_type = crate::files::content_type_of(path);
        let state = upload_state(conversation, path)?;
        let mut bar = progress_bar(&path.display().to_string());
        let a = files
            .upload(conversation, path, content_type, Some(&state), &mut bar)
            .await?;
        eprintln!();
        if content_type.starts_with("image/") && paths.len() == 1 {
            kind = MessageType::Image;
        }
        ids.push(a.attachment_id);
    }
    Ok((kind, ids))
}

/// Writes the files of message `seq` under `out`.
pub(super) async fn download(
    client: &mut MessagingClient<Authed>,
    files: &mut Files,
    conversation: u64,
    seq: u64,
    out: &Path,
) -> anyhow::Result<()> {
    let page = client
        .pull(PullRequest {
            caller: files.caller.clone(),
            conversation_id: conversation,
            since_seq: seq.saturating_add(1),
            direction: Direction::Backward as i32,
            limit: 1,
        })
        .await
        .map_err(call_error)?
        .into_inner();
    let message = page
        .messages
        .into_iter()
        .find(|m| m.seq == seq)
        .ok_or_else(|| anyhow::anyhow!("no message {seq} you can see"))?;
    if message.attachments.is_empty() {
        anyhow::bail!("message {seq} carries no files");
    }
    let mut bar = progress_bar("download");
    let written = files.download(&message, out, &mut bar).await?;
    eprintln!();
    for path in written {
        println!("{} (SHA-256 verified)", path.display());
    }
    Ok(())
}

/// Where the id of an unfinished upload of `path` is kept, so running the
/// same command again resumes it.
fn upload_state(conversation: u64, path: &Path) -> anyhow::Result<PathBuf> {
    let dir = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join(".cache/cellmesh/uploads");
    std::fs::create_dir_all(&dir)?;
    let full = std::fs::canonicalize(path)?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(&full, &mut h);
    Ok(dir.join(format!(
        "{conversation}-{:016x}",
        std::hash::Hasher::finish(&h)
    )))
}

/// A one-line progress bar on stderr.
fn progress_bar(label: &str) -> impl FnMut(u64, u64) + Send + use<> {
    let label = label.to_string();
    move |done, total| {
        let pct = (done * 100).checked_div(total).unwrap_or(100);
        let filled = (pct / 5) as usize;
        eprint!(
            "\r{label} [{}{}] {pct:>3}% {done}/{total} bytes",
            "#".repeat(filled),
            " ".repeat(20 - filled)
        );
    }
}
