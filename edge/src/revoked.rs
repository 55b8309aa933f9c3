//! Revoked tokens: the ids (`jti`) in `revoked_tokens` and in
//! `revoked_tokens_file` (one per line, `#` starts a comment), the file
//! read again when it changes (at most once a second, like the directory;
//! one that cannot be read keeps the last list in service). A token on the
//! list is refused (`TOKEN_REVOKED`), and an open sync stream of one ends
//! (see `open_streams`).

use std::collections::HashSet;

use cellmesh_proto::tls::files::Watched;

pub struct Revoked {
    fixed: HashSet<String>,
    file: Option<(String, Watched<HashSet<String>>)>,
}

/// The ids a revocation file lists.
pub fn parse(text: &str) -> HashSet<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

impl Revoked {
    /// Nothing but `fixed`.
    pub fn new(fixed: &[String]) -> Self {
        Self {
            fixed: fixed.iter().cloned().collect(),
            file: None,
        }
    }

    /// Also the ids `path` lists, followed as it changes.
    pub fn with_file(mut self, path: &str) -> Result<Self, String> {
        let file = path.to_string();
        let watched = Watched::new(&[path], move || {
            std::fs::read_to_string(&file)
                .map(|text| parse(&text))
                .map_err(|e| format!("cannot read {file}: {e}"))
        })?;
        self.file = Some((path.to_string(), watched));
        Ok(self)
    }

    pub fn contains(&self, jti: &str) -> bool {
        self.fixed.contains(jti)
            || self
                .file
                .as_ref()
                .is_some_and(|(_, ids)| ids.get().contains(jti))
    }
}

impl std::fmt::Debug for Revoked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Revoked")
            .field("fixed", &self.fixed.len())
            .field("file", &self.file.as_ref().map(|(p, _)| p))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revocation_file_is_followed_as_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("revoked");
        std::fs::write(&path, "# revoked\nabc\n").unwrap();
        let revoked = Revoked::new(&["fixed".into()])
            .with_file(path.to_str().unwrap())
            .unwrap();
        assert!(revoked.contains("abc") && revoked.contains("fixed"));
        assert!(!revoked.contains("def"));
        std::fs::write(&path, "abc\ndef  # later\n").unwrap();
        revoked.file.as_ref().unwrap().1.check(true);
        assert!(revoked.contains("def"));
        assert!(Revoked::new(&[]).with_file("/nonexistent/revoked").is_err());
    }
}
