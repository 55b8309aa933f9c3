//! `cellmesh bench attachments`: files through a cell it starts, stored in
//! a local directory (the cell serves the signed URLs) or an S3 bucket
//! (`--s3-endpoint`, e.g. moto; the bytes go from this client to the
//! bucket, never through the cell). Measures the latency of a download URL
//! (`GetDownloadUrl`: membership, visibility and signing) and the MB/s of
//! whole uploads (hash, PUT parts, complete with read-back) and verified
//! downloads at each `--sizes`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cellmesh_cell::cold::TierStore;
use cellmesh_client::connect::{attachments_as, caller, connect};
use cellmesh_client::files::Files;
use cellmesh_proto::v1::{
    ConversationKind, CreateConversationRequest, Direction, GetDownloadUrlRequest, MessageType,
    PullRequest,
};
use clap::Args;
use hdrhistogram::Histogram;
use rand::RngCore;

use crate::{Report, count_error, send_request};

#[derive(Args)]
pub struct AttachmentsArgs {
    /// File sizes in MiB.
    #[arg(long, value_delimiter = ',', default_value = "1,200")]
    sizes_mb: Vec<u64>,
    /// Files of each size.
    #[arg(long, default_value_t = 3)]
    files: usize,
    /// Download URLs requested for the latency figures.
    #[arg(long, default_value_t = 2_000)]
    urls: u64,
    /// An S3 endpoint (e.g. a local moto_server); the bucket is created if
    /// missing. Without it, a directory beside the cell's data.
    #[arg(long)]
    s3_endpoint: Option<String>,
    #[arg(long, default_value = "cellmesh-bench-files")]
    s3_bucket: String,
    #[arg(long, default_value_t = 8)]
    part_mb: u64,
    /// Also upload a file of this many MiB whose client stops after half
    /// its parts, then resume it (0: skip).
    #[arg(long, default_value_t = 0)]
    resume_mb: u64,
    #[arg(long)]
    json: Option<PathBuf>,
}

const TENANT: u64 = 1;

pub async fn run(args: AttachmentsArgs) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cell = start_cell(&args, dir.path()).await?;
    let endpoint = format!("http://{}", cell.addr);
    let mut client = connect(&endpoint).await?;
    let conversation = client
        .create_conversation(CreateConversationRequest {
            caller: caller(TENANT, 1),
            kind: ConversationKind::Group as i32,
            member_ids: vec![2],
            title: "bench files".into(),
            client_req_id: "bench-files".into(),
        })
        .await?
        .into_inner()
        .conversation
        .map(|c| c.conversation_id)
        .unwrap_or_default();
    let mut alice = Files::new(attachments_as(&endpoint, None).await?, caller(TENANT, 1));
    let mut bob = Files::new(attachments_as(&endpoint, None).await?, caller(TENANT, 2));
    let mut params: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    let mut last = None;
    let mut moved = 0u64;
    let started = Instant::now();
    for &mb in &args.sizes_mb {
        let round = Round {
            client: &mut client,
            alice: &mut alice,
            bob: &mut bob,
            conversation,
            dir: dir.path(),
        };
        let (up, down, sent) = round.run(mb, args.files).await?;
        let bytes = (mb * 1024 * 1024 * args.files as u64) as f64;
        let rate = |d: Duration| bytes / d.as_secs_f64().max(1e-9) / (1024.0 * 1024.0);
        params.insert(format!("upload_mb_s_{mb}mb"), rate(up).into());
        params.insert(format!("download_mb_s_{mb}mb"), rate(down).into());
        last = sent.or(last);
        moved += args.files as u64;
    }
    let elapsed = started.elapsed();
    if args.resume_mb > 0 {
        let resumed = resume(&mut alice, conversation, dir.path(), args.resume_mb).await?;
        params.extend(resumed);
    }
    let (histogram, errors) = match last {
        Some((seq, attachment)) => {
            url_latency(&mut bob, conversation, seq, attachment, args.urls).await?
        }
        None => (Histogram::<u64>::new(3)?, BTreeMap::new()),
    };
    cell.shutdown().await?;
    let store = if args.s3_endpoint.is_some() {
        "s3"
    } else {
        "local"
    };
    let mut report = Report::new("attachments", moved, errors, elapsed, &histogram)
        .param("store", store)
        .param("files_per_size", args.files as u64)
        .param("part_mb", args.part_mb)
        .param("download_url_requests", args.urls);
    report.params.extend(params);
    report.print();
    println!("(latency: GetDownloadUrl round trips; throughput: files per second, both ways)");
    if let Some(path) = &args.json {
        report.write_json(path)?;
    }
    Ok(())
}

/// A cell of its own over `dir`, its files in a local directory or the
/// S3 bucket the flags name (created if missing).
async fn start_cell(
    args: &AttachmentsArgs,
    dir: &std::path::Path,
) -> anyhow::Result<cellmesh_cell::RunningCell> {
    let mut config = cellmesh_cell::CellConfig {
        listen: "127.0.0.1:0".parse()?,
        data_dir: dir.join("cell"),
        ..Default::default()
    };
    config.rate_limit.user_calls_per_sec = 1_000_000;
    config.rate_limit.user_calls_burst = 1_000_000;
    config.rate_limit.user_uploads_per_minute = 1_000_000;
    let a = &mut config.attachments;
    a.part_bytes = args.part_mb * 1024 * 1024;
    a.max_file_bytes = a.part_bytes * 10_000;
    if let Some(endpoint) = &args.s3_endpoint {
        a.store = TierStore::S3;
        a.s3 = crate::s3_bucket(endpoint, &args.s3_bucket);
        // A bucket on a local S3 API (moto takes unsigned requests).
        let _ = reqwest::Client::new()
            .put(format!("{endpoint}/{}", args.s3_bucket))
            .send()
            .await;
    }
    crate::own_cell(config).await
}

/// One file size's uploads, sends and downloads.
struct Round<'a> {
    client:
        &'a mut cellmesh_proto::v1::messaging_client::MessagingClient<tonic::transport::Channel>,
    alice: &'a mut Files,
    bob: &'a mut Files,
    conversation: u64,
    dir: &'a std::path::Path,
}

impl Round<'_> {
    /// `files` files of `mb` MiB up (alice), sent, and down (bob): the
    /// time spent each way and the last file's (seq, attachment).
    async fn run(
        self,
        mb: u64,
        files: usize,
    ) -> anyhow::Result<(Duration, Duration, Option<(u64, u64)>)> {
        let path = self.dir.join(format!("file-{mb}mb.bin"));
        write_random(&path, mb * 1024 * 1024)?;
        let (mut up, mut down, mut last) = (Duration::ZERO, Duration::ZERO, None);
        for i in 0..files {
            let t = Instant::now();
            let a = (self.alice)
                .upload(
                    self.conversation,
                    &path,
                    "application/octet-stream",
                    None,
                    &mut |_, _| {},
                )
                .await?;
            up += t.elapsed();
            let mut req = send_request(
                TENANT,
                1,
                self.conversation,
                format!("file-{mb}-{i}"),
                MessageType::File,
                Vec::new(),
            );
            req.attachment_ids = vec![a.attachment_id];
            let seq = self.client.send(req).await?.into_inner().seq;
            let message = (self.client)
                .pull(PullRequest {
                    caller: caller(TENANT, 2),
                    conversation_id: self.conversation,
                    since_seq: seq + 1,
                    direction: Direction::Backward as i32,
                    limit: 1,
                })
                .await?
                .into_inner()
                .messages
                .remove(0);
            let out = self.dir.join(format!("down-{mb}-{i}"));
            let t = Instant::now();
            self.bob.download(&message, &out, &mut |_, _| {}).await?;
            down += t.elapsed();
            std::fs::remove_dir_all(&out)?;
            last = Some((seq, a.attachment_id));
        }
        std::fs::remove_file(&path)?;
        Ok((up, down, last))
    }
}

/// `count` download URLs one after another: the signing path's latency.
async fn url_latency(
    bob: &mut Files,
    conversation: u64,
    seq: u64,
    attachment: u64,
    count: u64,
) -> anyhow::Result<(Histogram<u64>, BTreeMap<String, u64>)> {
    let mut histogram = Histogram::<u64>::new(3)?;
    let mut errors = BTreeMap::new();
    for _ in 0..count {
        let t = Instant::now();
        let request = GetDownloadUrlRequest {
            caller: caller(TENANT, 2),
            conversation_id: conversation,
            seq,
            attachment_id: attachment,
            thumbnail: false,
        };
        match bob.client.get_download_url(request).await {
            Ok(_) => histogram.record(t.elapsed().as_micros() as u64)?,
            Err(status) => count_error(&mut errors, &status),
        }
    }
    Ok((histogram, errors))
}

/// Uploads half of a `mb` MiB file's parts as a client that then dies
/// would, and resumes it from a state file: the figures of the resumption.
async fn resume(
    files: &mut Files,
    conversation: u64,
    dir: &std::path::Path,
    mb: u64,
) -> anyhow::Result<BTreeMap<String, serde_json::Value>> {
    let path = dir.join("resumed.bin");
    write_random(&path, mb * 1024 * 1024)?;
    let (size, sha256) = cellmesh_client::files::sha256_file(&path).await?;
    let upload = files
        .client
        .create_upload(cellmesh_proto::v1::CreateUploadRequest {
            caller: files.caller.clone(),
            conversation_id: conversation,
            name: "resumed.bin".into(),
            content_type: "application/octet-stream".into(),
            size,
            sha256: sha256.clone(),
            client_req_id: String::new(),
        })
        .await?
        .into_inner();
    let half = upload.parts.len() / 2;
    let http = reqwest::Client::new();
    let mut file = std::fs::File::open(&path)?;
    for part in &upload.parts[..half] {
        use std::io::{Read, Seek};
        let start = (u64::from(part.part_number) - 1) * upload.part_size;
        file.seek(std::io::SeekFrom::Start(start))?;
        let mut bytes = vec![0u8; part.size as usize];
        file.read_exact(&mut bytes)?;
        http.put(&part.url)
            .body(bytes)
            .send()
            .await?
            .error_for_status()?;
    }
    let state = dir.join("resume.state");
    std::fs::write(&state, format!("{} {size} {sha256}\n", upload.upload_id))?;
    let mut resumed_from = None;
    let t = Instant::now();
    files
        .upload(
            conversation,
            &path,
            "application/octet-stream",
            Some(&state),
            &mut |done, _| {
                resumed_from.get_or_insert(done);
            },
        )
        .await?;
    let seconds = t.elapsed().as_secs_f64();
    let from = resumed_from.unwrap_or(0);
    std::fs::remove_file(&path)?;
    let mut out = BTreeMap::new();
    out.insert("resume_file_mb".into(), mb.into());
    out.insert("resume_parts_stored_before".into(), (half as u64).into());
    out.insert("resume_resumed_from_bytes".into(), from.into());
    out.insert("resume_seconds".into(), seconds.into());
    let rest = (size - from) as f64 / (1024.0 * 1024.0);
    out.insert(
        "resume_remaining_mb_s".into(),
        (rest / seconds.max(1e-9)).into(),
    );
    Ok(out)
}

pub(crate) fn write_random(path: &std::path::Path, len: u64) -> anyhow::Result<()> {
    use std::io::Write;
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut buf = vec![0u8; 1024 * 1024];
    let mut left = len;
    while left > 0 {
        rand::rng().fill_bytes(&mut buf);
        let n = left.min(buf.len() as u64) as usize;
        file.write_all(&buf[..n])?;
        left -= n as u64;
    }
    file.flush()?;
    Ok(())
}
