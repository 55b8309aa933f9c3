//! `cellmesh chat`: a small real client of the messaging API, enough for a
//! person to create conversations, talk and read history.

use cellmesh_proto::v1::{
    Caller, ChangeMembersRequest, ConversationKind, CreateConversationRequest, Direction,
    GetConversationRequest, MarkReadRequest, Message, MessageState, MessageType, PullRequest,
    ReadCountRequest, RecallRequest, SendRequest,
};
use clap::{Args, Subcommand};

use crate::connect::{attachments_as, call_error, caller, connect_as};

mod files;
mod search;
mod tail;

#[derive(Args)]
pub struct ChatArgs {
    /// gRPC endpoint of a cell.
    #[arg(
        long,
        env = "CELLMESH_ENDPOINT",
        default_value = "http://127.0.0.1:7400"
    )]
    endpoint: String,
    #[arg(long, env = "CELLMESH_TENANT", default_value_t = 1)]
    tenant: u64,
    /// The user to act as (taken from the token when one is given).
    #[arg(long, env = "CELLMESH_USER", required_unless_present = "token")]
    user: Option<u64>,
    /// A token from `cellmesh ctl token` (or `cellmesh dev`): talk to an
    /// edge as the user it names.
    #[arg(long, env = "CELLMESH_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(subcommand)]
    command: ChatCommand,
}

#[derive(Subcommand)]
enum ChatCommand {
    /// Create a conversation; prints its id.
    Create {
        /// A 1:1 conversation with exactly one other member.
        #[arg(long)]
        direct: bool,
        #[arg(long, default_value = "")]
        title: String,
        /// Other members, comma-separated user ids.
        #[arg(long, value_delimiter = ',', required = true)]
        members: Vec<u64>,
    },
    /// Send a text message, with files if --file is given.
    Send {
        #[arg(long, short)]
        conversation: u64,
        /// Directed message: only these members (comma-separated) see it.
        #[arg(long, value_delimiter = ',')]
        to: Vec<u64>,
        /// A file to attach (repeat for several). An interrupted upload
        /// resumes when the same command runs again.
        #[arg(long)]
        file: Vec<std::path::PathBuf>,
        /// The text (words are joined with spaces).
        #[arg(required_unless_present = "file")]
        text: Vec<String>,
    },
    /// Write a message's files under --out by their names, each checked
    /// against its SHA-256.
    Download {
        #[arg(long, short)]
        conversation: u64,
        #[arg(long)]
        seq: u64,
        #[arg(long, default_value = ".")]
        out: std::path::PathBuf,
    },
    /// Show history, oldest first: the latest page, or the page before --before.
    History {
        #[arg(long, short)]
        conversation: u64,
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Show messages older than this seq.
        #[arg(long, default_value_t = 0)]
        before: u64,
    },
    /// Show a conversation, its members and your unread count.
    Info {
        #[arg(long, short)]
        conversation: u64,
    },
    /// Mark everything up to --seq (default: the latest) as read.
    Read {
        #[arg(long, short)]
        conversation: u64,
        #[arg(long, default_value_t = u64::MAX)]
        seq: u64,
    },
    /// How many members have read each of the messages --seq names.
    Receipts {
        #[arg(long, short)]
        conversation: u64,
        #[arg(long, required = true, num_args = 1..)]
        seq: Vec<u64>,
    },
    /// Recall one of your messages.
    Recall {
        #[arg(long, short)]
        conversation: u64,
        #[arg(long)]
        seq: u64,
    },
    /// Follow this device's sync queue live: messages as they arrive.
    Tail {
        /// This device's id (its cursor is kept per device).
        #[arg(long, default_value = "cli")]
        device: String,
        /// Start after this pts (0 = where this device left off).
        #[arg(long, default_value_t = 0)]
        from: u64,
    },
    /// List your conversations with unread counts.
    List,
    /// Find messages of your conversations, newest first: words (all must
    /// match) and "quoted phrases".
    Search {
        /// Only this conversation.
        #[arg(long, short, default_value_t = 0)]
        conversation: u64,
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// The next page (printed after a full one).
        #[arg(long, default_value = "")]
        cursor: String,
        #[arg(required = true)]
        query: Vec<String>,
    },
    /// Add members to a group.
    Invite {
        #[arg(long, short)]
        conversation: u64,
        #[arg(value_delimiter = ',', required = true)]
        users: Vec<u64>,
    },
}

pub async fn run(args: ChatArgs) -> anyhow::Result<()> {
    let (tenant, user) = match (&args.token, args.user) {
        (Some(token), _) => {
            let claims = cellmesh_edge::auth::TokenKey::peek(token)
                .ok_or_else(|| anyhow::anyhow!("the token is not a cellmesh token"))?;
            (claims.tenant.get(), claims.user.get())
        }
        (None, Some(user)) => (args.tenant, user),
        (None, None) => anyhow::bail!("--user or --token is required"),
    };
    let (mut client, sync) = connect_as(&args.endpoint, args.token.as_deref()).await?;
    let me = caller(tenant, user);
    let files = || async {
        let client = attachments_as(&args.endpoint, args.token.as_deref()).await?;
        anyhow::Ok(crate::files::Files::new(client, caller(tenant, user)))
    };
    match args.command {
        ChatCommand::Tail { device, from } => {
            return tail::run(sync, tenant, user, device, from).await;
        }
        ChatCommand::List => return tail::list(sync, tenant, user).await,
        ChatCommand::Search {
            conversation,
            limit,
            cursor,
            query,
        } => {
            let args = search::SearchArgs {
                query: query.join(" "),
                conversation,
                limit,
                cursor,
                direct: args.token.is_none(),
            };
            return search::run(&mut client, sync, me, args).await;
        }
        ChatCommand::Create {
            direct,
            title,
            members,
        } => create(&mut client, me, direct, title, members).await?,
        ChatCommand::Send {
            conversation,
            to,
            file,
            text,
        } => {
            let (kind, attachment_ids) = match file.is_empty() {
                true => (MessageType::Text, Vec::new()),
                false => files::upload_all(&mut files().await?, conversation, &file).await?,
            };
            let r = client
                .send(SendRequest {
                    caller: me,
                    conversation_id: conversation,
                    client_req_id: new_request_id(),
                    r#type: kind as i32,
                    body: text.join(" ").into_bytes(),
                    route_epoch: 0,
                    visible_to: to,
                    attachment_ids,
                })
                .await
                .map_err(call_error)?
                .into_inner();
            println!("sent seq {} msg_id {}", r.seq, r.msg_id);
        }
        ChatCommand::Download {
            conversation,
            seq,
            out,
        } => {
            let mut files = files().await?;
            files::download(&mut client, &mut files, conversation, seq, &out).await?;
        }
        ChatCommand::History {
            conversation,
            limit,
            before,
        } => history(&mut client, me, conversation, limit, before).await?,
        ChatCommand::Info { conversation } => info(&mut client, me, conversation).await?,
        ChatCommand::Read { conversation, seq } => read(&mut client, me, conversation, seq).await?,
        ChatCommand::Receipts { conversation, seq } => {
            receipts(&mut client, me, conversation, seq).await?
        }
        ChatCommand::Recall { conversation, seq } => {
            client
                .recall(RecallRequest {
                    caller: me,
                    conversation_id: conversation,
                    seq,
                })
                .await
                .map_err(call_error)?;
            println!("recalled seq {seq}");
        }
        ChatCommand::Invite {
            conversation,
            users,
        } => invite(&mut client, me, conversation, users).await?,
    }
    Ok(())
}

type Client = cellmesh_proto::v1::messaging_client::MessagingClient<crate::connect::Authed>;

/// `chat read`: marks `conversation` read up to `seq`.
async fn read(
    client: &mut Client,
    me: Option<Caller>,
    conversation: u64,
    seq: u64,
) -> anyhow::Result<()> {
    let r = client
        .mark_read(MarkReadRequest {
            caller: me,
            conversation_id: conversation,
            read_seq: seq,
        })
        .await
        .map_err(call_error)?
        .into_inner();
    println!(
        "read up to {} of {}; unread {}",
        r.read_seq, r.latest_seq, r.unread
    );
    Ok(())
}

/// `chat receipts`: how many members have read each of `seqs`.
async fn receipts(
    client: &mut Client,
    me: Option<Caller>,
    conversation: u64,
    seqs: Vec<u64>,
) -> anyhow::Result<()> {
    let r = client
        .read_count(ReadCountRequest {
            caller: me,
            conversation_id: conversation,
            seqs: seqs.clone(),
        })
        .await
        .map_err(call_error)?
        .into_inner();
    for (seq, read) in seqs.iter().zip(r.read) {
        println!("seq {seq}: read by {read} of {}", r.member_count);
    }
    Ok(())
}

/// `chat invite`: adds `users` to a group.
async fn invite(
    client: &mut Client,
    me: Option<Caller>,
    conversation: u64,
    users: Vec<u64>,
) -> anyhow::Result<()> {
    let r = client
        .add_members(ChangeMembersRequest {
            caller: me,
            conversation_id: conversation,
            user_ids: users,
        })
        .await
        .map_err(call_error)?
        .into_inner();
    println!("added {:?}", r.changed);
    Ok(())
}

/// `chat create`: a direct or group conversation with `members`.
async fn create(
    client: &mut Client,
    me: Option<Caller>,
    direct: bool,
    title: String,
    members: Vec<u64>,
) -> anyhow::Result<()> {
    let kind = if direct {
        ConversationKind::Direct
    } else {
        ConversationKind::Group
    };
    let response = client
        .create_conversation(CreateConversationRequest {
            caller: me,
            kind: kind as i32,
            title,
            member_ids: members,
            client_req_id: new_request_id(),
        })
        .await
        .map_err(call_error)?
        .into_inner();
    let c = response.conversation.unwrap_or_default();
    println!(
        "conversation {} ({} members)",
        c.conversation_id, c.member_count
    );
    Ok(())
}

/// `chat history`: a page of `conversation`, oldest first.
async fn history(
    client: &mut Client,
    me: Option<Caller>,
    conversation: u64,
    limit: u32,
    before: u64,
) -> anyhow::Result<()> {
    let page = client
        .pull(PullRequest {
            caller: me,
            conversation_id: conversation,
            since_seq: before,
            direction: Direction::Backward as i32,
            limit,
        })
        .await
        .map_err(call_error)?
        .into_inner();
    for m in page.messages.iter().rev() {
        println!("{}", render(m));
    }
    if page.has_more {
        println!("(older: --before {})", page.next_seq);
    }
    Ok(())
}

/// `chat info`: what `conversation` is and who is in it.
async fn info(client: &mut Client, me: Option<Caller>, conversation: u64) -> anyhow::Result<()> {
    let r = client
        .get_conversation(GetConversationRequest {
            caller: me,
            conversation_id: conversation,
            members_after: 0,
            member_limit: 0,
        })
        .await
        .map_err(call_error)?
        .into_inner();
    let c = r.conversation.unwrap_or_default();
    println!(
        "conversation {} {:?} {:?}: {} members, latest seq {}, unread {}",
        c.conversation_id,
        ConversationKind::try_from(c.kind).unwrap_or_default(),
        c.title,
        c.member_count,
        c.latest_seq,
        r.unread
    );
    let more = if r.members_truncated { " …" } else { "" };
    println!("members: {:?}{more}", r.member_ids);
    Ok(())
}

pub(crate) fn render(m: &Message) -> String {
    let files: String = m
        .attachments
        .iter()
        .map(|a| format!(" [file {} {} bytes]", a.name, a.size))
        .collect();
    let body = match MessageState::try_from(m.state) {
        Ok(MessageState::Recalled) => "(recalled)".to_string(),
        Ok(MessageState::Edited) => format!("{} (edited)", String::from_utf8_lossy(&m.body)),
        _ => String::from_utf8_lossy(&m.body).into_owned(),
    };
    format!("#{:<6} user {:<8} {body}{files}", m.seq, m.sender_id)
}

/// A request id unique enough for one person's commands.
fn new_request_id() -> String {
    format!("chat-{:032x}", rand::random::<u128>())
}
