//! Invariant 1 for files: an acknowledged send's files are stored with its
//! message and download intact (the SHA-256 of the bytes downloaded after
//! the drill is the one uploaded). A message the history lacks altogether
//! is the lost-send check's to report.

use std::collections::{HashMap, HashSet};

use super::Violation;
use crate::history::{FileRead, History, Outcome};

pub const NAME: &str = "acknowledged files download intact";

pub fn check(h: &History) -> Vec<Violation> {
    let acked: HashSet<(u64, &str)> = (h.sends.iter())
        .filter(|s| matches!(s.outcome, Outcome::Ok { .. }))
        .map(|s| (s.conversation, s.client_req_id.as_str()))
        .collect();
    let stored: HashSet<(u64, &str)> = (h.conversations.iter())
        .flat_map(|(c, msgs)| msgs.iter().map(move |m| (*c, m.tag.as_str())))
        .collect();
    let read: HashMap<(u64, &str, u64), &FileRead> = (h.files_read.iter())
        .map(|f| ((f.conversation, f.tag.as_str(), f.attachment_id), f))
        .collect();
    let mut out = Vec::new();
    for sent in &h.files_sent {
        let send = (sent.conversation, sent.client_req_id.as_str());
        if !acked.contains(&send) || !stored.contains(&send) {
            continue;
        }
        let detail = match read.get(&(send.0, send.1, sent.attachment_id)) {
            None => "is not on its stored message".to_string(),
            Some(f) if !f.error.is_empty() => format!("did not download: {}", f.error),
            Some(f) if f.sha256 != sent.sha256 => {
                format!("downloaded as {} instead of {}", f.sha256, sent.sha256)
            }
            Some(_) => continue,
        };
        out.push(Violation::new(
            NAME,
            format!(
                "file {} of acked send {:?} to conversation {} {detail}",
                sent.attachment_id, sent.client_req_id, sent.conversation
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use crate::history::FileSend;

    fn with_file() -> History {
        let mut h = good();
        h.files_sent.push(FileSend {
            conversation: 7,
            client_req_id: "b".into(),
            attachment_id: 40,
            sha256: "ab12".into(),
        });
        h.files_read.push(FileRead {
            conversation: 7,
            tag: "b".into(),
            attachment_id: 40,
            sha256: "ab12".into(),
            error: String::new(),
        });
        h
    }

    #[test]
    fn an_intact_file_holds() {
        assert!(check(&with_file()).is_empty());
    }

    #[test]
    fn a_missing_failed_or_altered_file_is_caught() {
        let mut h = with_file();
        h.files_read[0].sha256 = "ffff".into();
        assert!(check(&h)[0].detail.contains("instead of ab12"));
        h.files_read[0].error = "403 SIGNATURE_EXPIRED".into();
        assert!(check(&h)[0].detail.contains("did not download"));
        h.files_read.clear();
        assert!(check(&h)[0].detail.contains("not on its stored message"));
    }

    #[test]
    fn files_of_unacknowledged_or_missing_sends_are_not_owed() {
        let mut h = with_file();
        h.files_read.clear();
        h.sends[1].outcome = Outcome::Unknown;
        assert!(check(&h).is_empty());
        let mut h = with_file();
        h.files_read.clear();
        h.conversations.get_mut(&7).unwrap().remove(1);
        assert!(check(&h).is_empty(), "the lost-send check reports it");
    }
}
