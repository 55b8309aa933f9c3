//! `chat search`: messages of your conversations that match, newest first,
//! each with its snippet (matches in brackets) and where to find it.

use cellmesh_proto::v1::sync_client::SyncClient;
use cellmesh_proto::v1::{Caller, ListConversationsRequest, SearchRequest};

use super::{Client, render};
use crate::connect::{Authed, call_error};

pub struct SearchArgs {
    pub query: String,
    pub conversation: u64,
    pub limit: u32,
    pub cursor: String,
    /// Talking to a cell, not an edge: name the caller's conversations.
    pub direct: bool,
}

pub async fn run(
    client: &mut Client,
    mut sync: SyncClient<Authed>,
    me: Option<Caller>,
    args: SearchArgs,
) -> anyhow::Result<()> {
    // An edge finds the caller's conversations itself; a cell is told.
    let conversation_ids = if args.direct && args.conversation == 0 {
        sync.list_conversations(ListConversationsRequest {
            caller: me.clone(),
            limit: 0,
            ids_only: true,
        })
        .await
        .map_err(call_error)?
        .into_inner()
        .conversation_ids
    } else {
        Vec::new()
    };
    let r = client
        .search(SearchRequest {
            caller: me,
            query: args.query,
            conversation_id: args.conversation,
            page_size: args.limit,
            cursor: args.cursor,
            conversation_ids,
            ..Default::default()
        })
        .await
        .map_err(call_error)?
        .into_inner();
    for hit in &r.hits {
        let Some(m) = &hit.message else { continue };
        let mut snippet = hit.snippet.clone();
        for h in hit.highlights.iter().rev() {
            let (start, end) = (h.start as usize, h.end as usize);
            if end <= snippet.len()
                && snippet.is_char_boundary(start)
                && snippet.is_char_boundary(end)
            {
                snippet.insert(end, ']');
                snippet.insert(start, '[');
            }
        }
        println!("conversation {} {}", m.conversation_id, render(m));
        println!("    … {} …", snippet.replace('\n', " "));
    }
    if r.hits.is_empty() {
        println!("no messages found");
    }
    if r.partial {
        println!(
            "(partial: {} conversations could not be searched)",
            r.unsearched.len()
        );
    }
    if !r.next_cursor.is_empty() {
        println!("(more: --cursor {})", r.next_cursor);
    }
    Ok(())
}
