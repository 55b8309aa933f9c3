//! The demo tenant of `cellmesh dev`: tenant 1 placed on eu-west/c1, users
//! 1–4 with tokens, a group conversation moved live to us-east/c1 (so its
//! owner is in another region than its members' home) and a 1:1 one.
//! Created once and remembered in `DATA_DIR/demo.json`.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use cellmesh_control_plane::migration::{MigrationOptions, Migrator};
use cellmesh_edge::auth::{Claims, TokenKey, now_secs};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::{ConversationKind, CreateConversationRequest};
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::table::{Key, RouteState};
use serde::{Deserialize, Serialize};
use tonic::metadata::MetadataValue;

use super::topology::Topology;

pub const TENANT: u64 = 1;
const USERS: [u64; 4] = [1, 2, 3, 4];
const TOKEN_TTL_SECS: u64 = 30 * 24 * 3600;
/// How often the demo group's move is tried before `cellmesh dev` fails.
const MOVE_ATTEMPTS: u32 = 3;

#[derive(Serialize, Deserialize)]
pub struct DemoConversation {
    pub id: u64,
    pub title: String,
    pub members: Vec<u64>,
}

#[derive(Serialize, Deserialize)]
pub struct Demo {
    pub conversations: Vec<DemoConversation>,
    #[serde(skip)]
    tokens: Vec<(u64, String)>,
    #[serde(skip)]
    owners: Vec<String>,
}

impl Demo {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "tenant": TENANT,
            "token": self.tokens.first().map(|(_, t)| t.clone()).unwrap_or_default(),
            "tokens": self.tokens.iter().map(|(u, t)| (u.to_string(), t.clone())).collect::<std::collections::BTreeMap<_, _>>(),
            "conversations": self.conversations.iter().zip(&self.owners).map(|(c, owner)| serde_json::json!({
                "id": c.id, "title": c.title, "members": c.members, "owner": owner,
            })).collect::<Vec<_>>(),
        })
    }
}

async fn create(
    edge: &str,
    token: &str,
    title: &str,
    kind: ConversationKind,
    members: Vec<u64>,
) -> anyhow::Result<u64> {
    let mut client = MessagingClient::connect(edge.to_string()).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut request = tonic::Request::new(CreateConversationRequest {
            caller: None,
            kind: kind as i32,
            title: title.into(),
            member_ids: members.clone(),
            client_req_id: format!("demo-{title}"),
        });
        request.metadata_mut().insert(
            "authorization",
            MetadataValue::try_from(format!("Bearer {token}"))?,
        );
        match client.create_conversation(request).await {
            Ok(r) => return Ok(r.into_inner().conversation.map_or(0, |c| c.conversation_id)),
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "demo conversation not created yet");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                return Err(anyhow::anyhow!(
                    "creating the demo conversation: {}",
                    cellmesh_proto::status::describe(&e)
                ));
            }
        }
    }
}

/// Moves demo conversation `conversation` to cell `to`. A move that
/// failed part way (a write not answered in time on a loaded machine) is
/// resumed from where the route table says it is, as the control plane
/// would later.
async fn move_live(
    migrator: &Migrator,
    conversation: ConversationId,
    to: &str,
) -> anyhow::Result<()> {
    let key = Key::conversation(TenantId(TENANT), conversation);
    let mut attempt = 1;
    loop {
        let error =
            match (migrator.migrate_conversation(TenantId(TENANT), conversation, to, |_| {})).await
            {
                Ok(_) => return Ok(()),
                Err(e) => e,
            };
        migrator.routes().catch_up().await.ok();
        let moved = migrator
            .routes()
            .resolve(&key)
            .is_some_and(|r| r.entry.cell == to && r.entry.state == RouteState::Active);
        if moved {
            return Ok(());
        }
        if attempt == MOVE_ATTEMPTS {
            return Err(error.into());
        }
        tracing::warn!(%key, %error, attempt, "the demo move failed: resuming it");
        attempt += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub async fn prepare(
    data: &Path,
    routes: &RouteClient,
    topo: &Topology,
    cluster_secret: &str,
    token_secret: &str,
) -> anyhow::Result<Demo> {
    let key = TokenKey::new(token_secret);
    let tokens: Vec<(u64, String)> = USERS
        .iter()
        .map(|&user| {
            let claims = Claims {
                tenant: TenantId(TENANT),
                user: UserId(user),
                device: "dev".into(),
                exp: now_secs() + TOKEN_TTL_SECS,
                ..Default::default()
            };
            (user, key.issue(&claims))
        })
        .collect();
    let path = data.join("demo.json");
    let mut demo = match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str::<Demo>(&text).context("demo.json")?,
        Err(_) => {
            if routes.resolve(&Key::tenant(TenantId(TENANT))).is_none() {
                routes
                    .place_tenant(TenantId(TENANT), &topo.cell_id(0, 0))
                    .await
                    .map_err(|e| {
                        anyhow::anyhow!(
                            "placing the demo tenant: {}",
                            cellmesh_proto::status::describe(&e)
                        )
                    })?;
            }
            let edge = topo.edge(0);
            let general = create(
                &edge,
                &tokens[0].1,
                "general",
                ConversationKind::Group,
                vec![2, 3, 4],
            )
            .await?;
            let direct = create(
                &edge,
                &tokens[0].1,
                "1:1",
                ConversationKind::Direct,
                vec![2],
            )
            .await?;
            // The group moves live to another region.
            let migrator = Migrator::new(
                routes.clone(),
                ClusterSecret::new(cluster_secret),
                MigrationOptions::default(),
            );
            move_live(&migrator, ConversationId(general), &topo.cell_id(1, 0))
                .await
                .context("moving the demo group to us-east")?;
            let demo = Demo {
                conversations: vec![
                    DemoConversation {
                        id: general,
                        title: "general".into(),
                        members: vec![1, 2, 3, 4],
                    },
                    DemoConversation {
                        id: direct,
                        title: "1:1".into(),
                        members: vec![1, 2],
                    },
                ],
                tokens: Vec::new(),
                owners: Vec::new(),
            };
            std::fs::write(&path, serde_json::to_string_pretty(&demo)?)?;
            demo
        }
    };
    demo.owners = demo
        .conversations
        .iter()
        .map(|c| {
            routes
                .resolve(&Key::conversation(TenantId(TENANT), ConversationId(c.id)))
                .map(|r| r.entry.cell)
                .unwrap_or_default()
        })
        .collect();
    demo.tokens = tokens;
    Ok(demo)
}
