//! What every invariant about devices presumes: a device sees only its own
//! tenant. Tenants share cells and choose their user ids freely, so user 2
//! of one tenant and user 2 of another are two people; an event about a
//! conversation of another tenant reaching a device is a leak of that
//! tenant's messages, whatever else holds.

use super::Violation;
use crate::history::History;

pub const NAME: &str = "devices receive only their own tenant's events";

pub fn check(h: &History) -> Vec<Violation> {
    h.deliveries
        .iter()
        .filter_map(|d| {
            let owner = *h.tenants.get(&d.conversation)?;
            (owner != d.tenant).then(|| {
                Violation::new(
                    NAME,
                    format!(
                        "tenant {} user {} device {:?} received conversation {} seq {} (pts {}) of tenant {owner}",
                        d.tenant, d.user, d.device, d.conversation, d.seq, d.pts
                    ),
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn an_event_of_another_tenant_on_a_device_is_caught() {
        let mut h = good();
        assert!(check(&h).is_empty());
        // Tenant 2's user 2 (same id, another person) is handed tenant 1's
        // message.
        let mut leaked = delivery("phone", 1, 1, 1);
        leaked.tenant = 2;
        h.deliveries.push(leaked);
        let found = check(&h);
        assert_eq!(found.len(), 1);
        assert!(found[0].detail.contains("of tenant 1"), "{:?}", found[0]);
        // A conversation the drill did not write to is not judged.
        h.deliveries.last_mut().unwrap().conversation = 99;
        assert!(check(&h).is_empty());
    }
}
