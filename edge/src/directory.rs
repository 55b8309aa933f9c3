//! The users each tenant has, as the operator lists them (`directory_file`
//! of the edge): one `<tenant> <user>` per line, or `<tenant> *` for a
//! tenant that admits every user its tokens name; `#` starts a comment. An
//! edge with a directory refuses a token for a user it does not list
//! (`UNAUTHENTICATED` / `UNKNOWN_USER`), so a token signed for an invented
//! user id is worth nothing. The file is read again when it changes (at
//! most once a second, like the `[tls]` files); one that does not parse
//! keeps the last good list in service.

use cellmesh_proto::ids::{TenantId, UserId};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use cellmesh_proto::tls::files::Watched;

/// Whom one tenant admits.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Admits {
    Everyone,
    Users(HashSet<u64>),
}

/// One reading of the directory file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Directory {
    tenants: HashMap<u64, Admits>,
}

impl Directory {
    /// Parses the file's text; the first bad line is named.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut tenants: HashMap<u64, Admits> = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |why: &str| format!("line {}: {why}: {line:?}", n + 1);
            let mut fields = line.split_whitespace();
            let (Some(tenant), Some(user), None) = (fields.next(), fields.next(), fields.next())
            else {
                return Err(bad("expected `<tenant> <user>` or `<tenant> *`"));
            };
            let tenant = id(tenant).ok_or_else(|| bad("the tenant is not an id above 0"))?;
            let entry = tenants
                .entry(tenant)
                .or_insert_with(|| Admits::Users(HashSet::new()));
            if user == "*" {
                *entry = Admits::Everyone;
                continue;
            }
            let user = id(user).ok_or_else(|| bad("the user is not an id above 0"))?;
            if let Admits::Users(users) = entry {
                users.insert(user);
            }
        }
        Ok(Self { tenants })
    }

    /// Whether `tenant` has `user`.
    pub fn admits(&self, tenant: TenantId, user: UserId) -> bool {
        match self.tenants.get(&tenant.get()) {
            Some(Admits::Everyone) => true,
            Some(Admits::Users(users)) => users.contains(&user.get()),
            None => false,
        }
    }
}

fn id(text: &str) -> Option<u64> {
    text.parse().ok().filter(|&id| id > 0)
}

/// The directory file, followed as it changes.
pub struct Users {
    path: String,
    current: Watched<Directory>,
}

impl Users {
    /// Reads `path` (an error names the file and the line).
    pub fn load(path: &str) -> Result<Arc<Self>, String> {
        let file = path.to_string();
        let current = Watched::new(&[path], move || {
            let text =
                std::fs::read_to_string(&file).map_err(|e| format!("cannot read {file}: {e}"))?;
            Directory::parse(&text).map_err(|e| format!("{file}: {e}"))
        })?;
        Ok(Arc::new(Self {
            path: path.to_string(),
            current,
        }))
    }

    /// Whether `tenant` has `user`, as the file says now.
    pub fn admits(&self, tenant: TenantId, user: UserId) -> bool {
        self.current.get().admits(tenant, user)
    }
}

impl std::fmt::Debug for Users {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Users").field("path", &self.path).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_users_and_open_tenants_are_admitted_and_no_one_else() {
        let d = Directory::parse("# tenant user\n1 10\n1 11  # a comment\n\n2 *\n").unwrap();
        assert!(d.admits(TenantId(1), UserId(10)) && d.admits(TenantId(1), UserId(11)));
        assert!(!d.admits(TenantId(1), UserId(12)), "an unlisted user");
        assert!(
            d.admits(TenantId(2), UserId(999)),
            "a tenant that admits everyone"
        );
        assert!(!d.admits(TenantId(3), UserId(10)), "an unlisted tenant");
        // `*` wins whichever line comes first.
        let d = Directory::parse("4 *\n4 7\n").unwrap();
        assert!(d.admits(TenantId(4), UserId(8)));
    }

    #[test]
    fn a_bad_line_is_named() {
        for (text, line) in [
            ("1 10\n1\n", "line 2"),
            ("1 10 11\n", "line 1"),
            ("x 10\n", "line 1"),
            ("1 0\n", "line 1"),
            ("0 *\n", "line 1"),
            ("1 10\n\n1 -3\n", "line 3"),
        ] {
            let e = Directory::parse(text).unwrap_err();
            assert!(e.starts_with(line), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_changed_file_is_followed_and_a_broken_one_keeps_the_last_list() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users");
        std::fs::write(&path, "1 10\n").unwrap();
        let users = Users::load(path.to_str().unwrap()).unwrap();
        assert!(users.admits(TenantId(1), UserId(10)) && !users.admits(TenantId(1), UserId(11)));
        std::fs::write(&path, "1 10\n1 11\n").unwrap();
        users.current.check(true);
        assert!(users.admits(TenantId(1), UserId(11)));
        std::fs::write(&path, "1 eleven\n").unwrap();
        users.current.check(true);
        assert!(
            users.admits(TenantId(1), UserId(11)),
            "the last good list stays"
        );
        assert!(Users::load("/nonexistent/users").is_err());
    }
}
