//! A tenant's point-in-time export, for operators' mistakes and legal
//! requests: the conversations this cell owns of the tenant, their members
//! and every message — hot rows and cold segments merged, a hot overlay
//! (a recall or edit of a cold message) winning — as JSON lines in the
//! backup store, with a manifest written last:
//! `exports/tenant-<T>/<id>/{conversations,messages}.jsonl` and
//! `manifest.json`. One line per conversation and per message, in
//! conversation and seq order (see [`super::lines`]).

use std::io::Write;
use std::path::Path;

use cellmesh_proto::ids::{ConversationId, TenantId};
use serde::{Deserialize, Serialize};

use super::lines::{ConversationLine, MessageLine};
use super::manifest::FileEntry;
use super::{BackupError, Backups, Result, files};
use crate::message::MessageService;

/// An export's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportManifest {
    pub id: String,
    pub tenant: u64,
    pub cell: String,
    pub created_ms: u64,
    pub conversations: u64,
    pub messages: u64,
    pub files: Vec<FileEntry>,
}

fn write_line(out: &mut impl Write, line: &impl Serialize) -> Result<()> {
    serde_json::to_writer(&mut *out, line).map_err(|e| BackupError::Io(e.to_string()))?;
    out.write_all(b"\n")
        .map_err(|e| BackupError::Io(e.to_string()))
}

impl Backups {
    fn export_root(&self, tenant: TenantId) -> String {
        match self.prefix.as_str() {
            "" => format!("exports/tenant-{}", tenant.get()),
            prefix => format!("{prefix}/exports/tenant-{}", tenant.get()),
        }
    }

    /// Exports what this cell owns of `tenant`.
    pub async fn export_tenant(
        &self,
        service: &MessageService,
        tenant: TenantId,
        now_ms: u64,
    ) -> Result<ExportManifest> {
        let id = super::manifest::new_id(now_ms);
        let staging = self.data_dir.join(format!("export-staging-{id}"));
        std::fs::create_dir_all(&staging).map_err(|e| BackupError::Io(e.to_string()))?;
        let written = self.write_export(service, tenant, &staging).await;
        let uploaded = match written {
            Ok(counts) => self
                .upload_export(tenant, &id, &staging)
                .await
                .map(|f| (counts, f)),
            Err(e) => Err(e),
        };
        let _ = std::fs::remove_dir_all(&staging);
        let ((conversations, messages), files) = uploaded?;
        let manifest = ExportManifest {
            id: id.clone(),
            tenant: tenant.get(),
            cell: self.cell.clone(),
            created_ms: now_ms,
            conversations,
            messages,
            files,
        };
        let body = serde_json::to_vec(&manifest).map_err(|e| BackupError::Io(e.to_string()))?;
        let key = format!("{}/{id}/manifest.json", self.export_root(tenant));
        self.store.put(&key.as_str().into(), body.into()).await?;
        Ok(manifest)
    }

    /// Writes the two files into `dir`: (conversations, messages).
    async fn write_export(
        &self,
        service: &MessageService,
        tenant: TenantId,
        dir: &Path,
    ) -> Result<(u64, u64)> {
        let open = |name: &str| {
            std::fs::File::create(dir.join(name))
                .map(std::io::BufWriter::new)
                .map_err(|e| BackupError::Io(e.to_string()))
        };
        let (mut conversations, mut messages) =
            (open("conversations.jsonl")?, open("messages.jsonl")?);
        let (mut n_conversations, mut n_messages) = (0, 0);
        let store = service.store();
        for conversation in service.exportable(tenant)? {
            let id = conversation.get();
            let Some(record) = store.conversation(ConversationId(id))? else {
                continue;
            };
            let (members, _) = store.members(ConversationId(id), 0, usize::MAX)?;
            let seq = store.conv_seq(ConversationId(id))?;
            let line = ConversationLine::new(id, &record, members, &seq);
            write_line(&mut conversations, &line)?;
            n_conversations += 1;
            for (seq, message) in service.whole_history(conversation).await? {
                write_line(&mut messages, &MessageLine::new(id, seq, &message))?;
                n_messages += 1;
            }
        }
        for mut out in [conversations, messages] {
            out.flush().map_err(|e| BackupError::Io(e.to_string()))?;
            out.get_ref()
                .sync_all()
                .map_err(|e| BackupError::Io(e.to_string()))?;
        }
        Ok((n_conversations, n_messages))
    }

    async fn upload_export(
        &self,
        tenant: TenantId,
        id: &str,
        dir: &Path,
    ) -> Result<Vec<FileEntry>> {
        let mut throttle = files::Throttle::new(self.rate);
        let mut out = Vec::new();
        for name in ["conversations.jsonl", "messages.jsonl"] {
            let key = format!("{}/{id}/{name}", self.export_root(tenant));
            let (size, sha256) = files::upload(
                &*self.store,
                &key.as_str().into(),
                &dir.join(name),
                &mut throttle,
            )
            .await?;
            out.push(FileEntry {
                name: name.into(),
                key,
                size,
                sha256,
            });
        }
        Ok(out)
    }

    /// The lines of export `id` of `tenant`'s file `name`, checked against
    /// the manifest.
    pub async fn export_lines<T: serde::de::DeserializeOwned>(
        &self,
        tenant: TenantId,
        id: &str,
        name: &str,
    ) -> Result<Vec<T>> {
        let root = self.export_root(tenant);
        let read = |key: String| async move {
            match self.store.get(&key.as_str().into()).await {
                Ok(got) => Ok(got.bytes().await?),
                Err(object_store::Error::NotFound { .. }) => Err(BackupError::NotFound(key)),
                Err(e) => Err(e.into()),
            }
        };
        let manifest: ExportManifest = serde_json::from_slice(
            &read(format!("{root}/{id}/manifest.json")).await?,
        )
        .map_err(|e| BackupError::Manifest {
            key: format!("{root}/{id}/manifest.json"),
            detail: e.to_string(),
        })?;
        let entry = manifest
            .files
            .iter()
            .find(|f| f.name == name)
            .ok_or_else(|| BackupError::NotFound(format!("{id}/{name}")))?;
        let bytes = read(entry.key.clone()).await?;
        let sha: String = <sha2::Sha256 as sha2::Digest>::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if sha != entry.sha256 {
            return Err(BackupError::Io(format!(
                "{} does not match its digest",
                entry.key
            )));
        }
        bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).map_err(|e| BackupError::Io(e.to_string())))
            .collect()
    }
}
