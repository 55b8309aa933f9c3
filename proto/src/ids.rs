//! Typed identifiers: a tenant, a user, a conversation and a seq are all
//! `u64` on the wire, and a function that takes two or three of them side
//! by side (a storage key, a rate-limit bucket, an ownership check) cannot
//! tell them apart. These newtypes can: `hidden(conversation, user, seq)`
//! with the user and the seq swapped does not compile. Each is
//! `#[serde(transparent)]` and encodes as its `u64`, big-endian in keys,
//! so nothing stored or sent changes.

use serde::{Deserialize, Serialize};

macro_rules! id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub u64);

        impl $name {
            /// The number on the wire.
            pub const fn get(self) -> u64 {
                self.0
            }

            /// Ids as a repeated wire field carries them.
            pub fn many(ids: &[u64]) -> Vec<Self> {
                ids.iter().copied().map(Self).collect()
            }

            /// Big-endian, as keys sort.
            pub const fn to_be_bytes(self) -> [u8; 8] {
                self.0.to_be_bytes()
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }

        impl From<$name> for u64 {
            fn from(id: $name) -> u64 {
                id.0
            }
        }
    };
}

id!(
    /// A tenant: the unit of isolation, quotas and whole-tenant moves.
    TenantId
);
id!(
    /// A user, unique within its tenant.
    UserId
);
id!(
    /// A conversation, unique within the deployment.
    ConversationId
);
id!(
    /// A message's position in its conversation (1, 2, …; gaps only where
    /// an owner skipped on purpose).
    Seq
);
id!(
    /// A route-table epoch: which owner a caller resolved.
    Epoch
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_encode_as_their_numbers() {
        let c = ConversationId(258);
        assert_eq!(c.to_be_bytes(), 258u64.to_be_bytes());
        let seven = serde::de::value::U64Deserializer::<serde::de::value::Error>::new(7);
        assert_eq!(UserId::deserialize(seven).unwrap(), UserId(7));
        assert_eq!(c.to_string(), "258");
        assert!(Seq(2) > Seq(1));
    }
}
