//! Invariants 1 (second half) and 6: a send appears at most once — no tag
//! (client_req_id) twice in a conversation, no msg_id twice anywhere — so
//! retries and unknown outcomes never create a second message.

use std::collections::HashMap;

use super::Violation;
use crate::history::History;

pub const NAME: &str = "no message is stored twice";

pub fn check(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut ids: HashMap<u64, (u64, u64)> = HashMap::new();
    for (conv, msgs) in &h.conversations {
        let mut tags: HashMap<&str, u64> = HashMap::new();
        for m in msgs {
            if let Some(first) = tags.insert(m.tag.as_str(), m.seq) {
                out.push(Violation::new(
                    NAME,
                    format!(
                        "request {:?} created two messages in conversation {conv}: seq {first} and {}",
                        m.tag, m.seq
                    ),
                ));
            }
            if let Some((c, s)) = ids.insert(m.msg_id, (*conv, m.seq)) {
                out.push(Violation::new(
                    NAME,
                    format!(
                        "msg_id {} stored twice: conversation {c} seq {s} and conversation {conv} seq {}",
                        m.msg_id, m.seq
                    ),
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn a_retry_that_created_a_second_message_is_caught() {
        let mut h = good();
        let mut again = stored("b", 4);
        again.msg_id = 9999;
        h.conversations.get_mut(&7).unwrap().push(again);
        let v = check(&h);
        assert_eq!(v.len(), 1);
        assert!(v[0].detail.contains("two messages"));
    }

    #[test]
    fn a_reused_msg_id_is_caught() {
        let mut h = good();
        h.conversations.insert(8, vec![stored("x", 1)]);
        assert_eq!(check(&h).len(), 1);
    }
}
