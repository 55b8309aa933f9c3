//! Source side of a tenant move: the tenant's marks (each conversation's
//! and home's latest position, and what changed since the last answer),
//! and under the freeze its seal.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::v1::*;
use tonic::Status;

use super::*;
use crate::error::blocking;

impl Mover {
    pub async fn tenant_marks(&self, r: TenantMarksRequest) -> Result<TenantMarksResponse, Status> {
        let started = std::time::Instant::now();
        let (tenant, messages) = (r.tenant_id, &self.service);
        if r.seal {
            // After these waits every write of the frozen tenant is durable
            // and in the change log. Conversations and homes have gates of
            // their own.
            let conversations = async {
                if r.only_users {
                    return Ok(());
                }
                messages.seal_tenant_conversations(r.epoch).await
            };
            let users = (self.sync).seal_tenant_homes(r.epoch, &self.inbound);
            let (conversations, users) = tokio::join!(conversations, users);
            conversations?;
            users?;
        }
        let sealed = started.elapsed();
        // The cut comes before the reads: what is written after it is in
        // the next answer.
        let cut =
            (!r.only_users).then(|| messages.store().changes().cut(TenantId(tenant), r.since));
        let changed = cut.as_ref().and_then(|c| c.changed.clone());
        let (service, sync, incremental, users) = (
            self.service.clone(),
            self.sync.clone(),
            changed.is_some(),
            r.users,
        );
        let (conversations, users) = blocking(move || {
            let (conversations, extra) = match changed {
                _ if r.only_users => (Vec::new(), users),
                Some(changed) => {
                    let mut extra = users;
                    extra.extend(changed.users);
                    (
                        service.of_tenant(
                            TenantId(tenant),
                            &ConversationId::many(&changed.conversations),
                        )?,
                        extra,
                    )
                }
                None => (service.tenant_conversation_ids(TenantId(tenant))?, users),
            };
            let users = sync.tenant_user_ids(&conversations, &UserId::many(&extra))?;
            Ok((conversations, users))
        })
        .await?;
        let listed = started.elapsed();
        if r.seal {
            if r.only_users {
                (self.sync)
                    .seal_tenant_users(TenantId(tenant), &users, r.epoch, &self.inbound)
                    .await?;
            } else {
                messages.mark_tenant_sealed(TenantId(tenant)).await?;
                let sync = self.sync.clone();
                tokio::spawn(async move {
                    // Off the freeze: the switch comes first.
                    tokio::time::sleep(EXPAND_SEALED_AFTER).await;
                    if let Err(e) = sync.expand_sealed_tenants().await {
                        tracing::warn!(error = %e, "marking a sealed tenant's keys failed");
                    }
                });
            }
        }
        let marked = started.elapsed();
        // Scans (and digests) run off the request threads, which keep
        // answering probes and sends.
        let (service, sync, digest) = (self.service.clone(), self.sync.clone(), r.with_digest);
        let (conversations, users) = tokio::try_join!(
            blocking(move || service.conversation_marks(&conversations, digest)),
            blocking(move || sync.user_marks(TenantId(tenant), &users, digest)),
        )?;
        if r.seal {
            tracing::info!(
                tenant,
                conversations = conversations.len(),
                users = users.len(),
                incremental,
                seal_ms = sealed.as_millis() as u64,
                list_ms = (listed - sealed).as_millis() as u64,
                mark_ms = (marked - listed).as_millis() as u64,
                marks_ms = (started.elapsed() - marked).as_millis() as u64,
                "tenant sealed"
            );
        }
        Ok(TenantMarksResponse {
            conversations,
            users,
            token: cut.as_ref().map_or(0, |c| c.token),
            complete: cut.is_some_and(|c| c.changed.is_none()),
        })
    }
}
