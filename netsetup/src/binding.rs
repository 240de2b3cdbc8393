//! What the masquerade and bridge bindings share: their error, the work inside the pod's
//! namespace, the journal that undoes a failed run, the tap, and the sysctl record kept
//! in a link's alias.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;

use rtnetlink::Handle;

use crate::links::{self, LinkChange, LinkError, LinkState};
use crate::netns::{self, NetnsError, NetnsTarget};
use crate::nft::NftError;
use crate::sysctl::{self, SysctlError};
use crate::tap::{self, TapError};

/// Why setting up or tearing down a binding failed.
#[derive(Debug, thiserror::Error)]
pub enum BindingError {
    #[error("invalid pod network configuration: {0}")]
    InvalidConfig(String),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("pod interface {0} does not exist in the namespace")]
    PodInterfaceMissing(String),
    #[error("pod interface {0} has no global IPv4 or IPv6 address")]
    NoPodAddress(String),
    #[error("pod interface {0} has an IPv4 address but no IPv4 route to take a gateway from")]
    NoIpv4Route(String),
    #[error("conflict with the namespace's current state: {0}")]
    Clash(String),
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error(transparent)]
    Tap(#[from] TapError),
    #[error(transparent)]
    Sysctl(#[from] SysctlError),
    #[error(transparent)]
    Nft(#[from] NftError),
    #[error("cannot start the netlink connection: {0}")]
    Netlink(std::io::Error),
}

/// Linux's rules for an interface name: 1-15 bytes, no `/`, `:`, whitespace or NUL.
pub(crate) fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() < libc::IFNAMSIZ
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c == '\0')
}

/// Runs async netlink work on a thread inside `target`, with a connection opened there.
pub(crate) fn in_netns<T, F, Fut>(target: &NetnsTarget, work: F) -> Result<T, BindingError>
where
    T: Send + 'static,
    F: FnOnce(Handle) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, BindingError>>,
{
    netns::run_in(target, move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .map_err(BindingError::Netlink)?;
        runtime.block_on(async move {
            // The socket is opened here, on the thread that entered the namespace.
            let (connection, handle, _) =
                rtnetlink::new_connection().map_err(BindingError::Netlink)?;
            let connection = tokio::spawn(connection);
            let result = work(handle).await;
            connection.abort();
            result
        })
    })?
}

/// An undo action that needs more than one netlink request.
pub(crate) type Undo = Box<dyn FnOnce(Handle) -> Pin<Box<dyn Future<Output = Result<(), String>>>>>;

/// What this run changed, in order, so a failure can undo it.
#[derive(Default)]
pub(crate) struct Journal {
    steps: Vec<Step>,
}

pub(crate) enum Step {
    CreatedLink(u32),
    AddedAddress(u32, IpAddr, u8),
    Sysctl { key: String, previous: String },
    Other { what: &'static str, undo: Undo },
}

impl Journal {
    pub(crate) fn push(&mut self, step: Step) {
        self.steps.push(step);
    }

    /// Undoes every step, newest first; a failing step is logged and the rest still run.
    pub(crate) async fn roll_back(self, handle: &Handle) {
        for step in self.steps.into_iter().rev() {
            let result = match step {
                Step::CreatedLink(index) => links::delete_link(handle, index)
                    .await
                    .map_err(|e| e.to_string()),
                Step::AddedAddress(index, addr, prefix) => {
                    links::delete_addresses(handle, index, |a| {
                        a.addr == addr && a.prefix_len == prefix
                    })
                    .await
                    .map_err(|e| e.to_string())
                }
                Step::Sysctl { key, previous } => {
                    sysctl::write(&key, &previous).map_err(|e| e.to_string())
                }
                Step::Other { what, undo } => undo(handle.clone())
                    .await
                    .map_err(|e| format!("{what}: {e}")),
            };
            if let Err(err) = result {
                tracing::error!("rollback step failed: {err}");
            }
        }
    }
}

/// Runs a set-up in `target`: on failure, what it journaled is undone before returning.
pub(crate) fn journaled<T, F>(target: &NetnsTarget, work: F) -> Result<T, BindingError>
where
    T: Send + 'static,
    F: AsyncFnOnce(&Handle, &mut Journal) -> Result<T, BindingError> + Send + 'static,
{
    in_netns(target, move |handle| async move {
        let mut journal = Journal::default();
        match work(&handle, &mut journal).await {
            Ok(outcome) => Ok(outcome),
            Err(err) => {
                journal.roll_back(&handle).await;
                Err(err)
            }
        }
    })
}

/// The tap the VMM opens: its name and owner.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TapSpec<'a> {
    pub name: &'a str,
    pub owner_uid: u32,
    pub owner_gid: u32,
}

/// The existing link named like the tap, if any, after checking it can be reused: a tap
/// that is free or already on `bridge`. Anything else is a clash.
pub(crate) fn reusable_tap<'l>(
    all_links: &'l [LinkState],
    tap: TapSpec<'_>,
    bridge: Option<&LinkState>,
    bridge_name: &str,
) -> Result<Option<&'l LinkState>, BindingError> {
    let Some(existing) = all_links.iter().find(|l| l.name == tap.name) else {
        return Ok(None);
    };
    let is_tap = existing.tun.as_ref().is_some_and(|t| t.is_tap);
    let attached_elsewhere = existing
        .controller
        .is_some_and(|c| bridge.is_none_or(|b| b.index != c));
    if !is_tap || attached_elsewhere {
        return Err(BindingError::Clash(format!(
            "link {} exists but is not a tap free for bridge {bridge_name}",
            tap.name
        )));
    }
    Ok(Some(existing))
}

/// Creates the persistent tap (or fixes its owner), then puts it on the bridge with the
/// pod's MTU and brings it up (KubeVirt's `virt-chroot create-tap` and tap spec).
pub(crate) async fn attach_tap(
    handle: &Handle,
    journal: &mut Journal,
    tap: TapSpec<'_>,
    existing: Option<&LinkState>,
    bridge_index: u32,
    mtu: u32,
) -> Result<u32, BindingError> {
    let needs_owner = existing.is_none_or(|t| {
        t.tun.as_ref().is_none_or(|tun| {
            !tun.persistent || tun.owner != Some(tap.owner_uid) || tun.group != Some(tap.owner_gid)
        })
    });
    if needs_owner {
        tap::create_persistent_tap(tap.name, tap.owner_uid, tap.owner_gid, existing.is_none())?;
    }
    let index = match existing {
        Some(t) => t.index,
        None => {
            let created = links::link_by_name(handle, tap.name)
                .await?
                .ok_or_else(|| {
                    BindingError::Clash(format!("tap {} vanished after creation", tap.name))
                })?;
            journal.push(Step::CreatedLink(created.index));
            created.index
        }
    };
    links::change_link(
        handle,
        index,
        LinkChange {
            mtu: Some(mtu),
            controller: Some(bridge_index),
            up: true,
            ..Default::default()
        },
    )
    .await?;
    Ok(index)
}

/// Sets sysctl `key` to `value`, journaling the old value when it changes.
pub(crate) fn set_sysctl(
    journal: &mut Journal,
    key: &str,
    value: &str,
) -> Result<(), BindingError> {
    let previous = sysctl::read(key)?;
    if previous != value {
        sysctl::write(key, value)?;
        journal.push(Step::Sysctl {
            key: key.to_string(),
            previous,
        });
    }
    Ok(())
}

/// A record of sysctl values in a link's alias: `<prefix> key=value ...`, so it lives
/// and dies with the link.
pub(crate) fn alias_record(prefix: &str, values: &[(&str, String)]) -> String {
    let fields: Vec<String> = values.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{prefix} {}", fields.join(" "))
        .trim_end()
        .to_string()
}

/// The `key=value` pairs of an alias record with `prefix`, keeping only `allowed` keys
/// with numeric values, so a forged alias cannot write arbitrary sysctls.
pub(crate) fn parse_alias_record(
    alias: &str,
    prefix: &str,
    allowed: &[&str],
) -> Vec<(String, String)> {
    let Some(rest) = alias.strip_prefix(prefix) else {
        return Vec::new();
    };
    rest.split_whitespace()
        .filter_map(|field| field.split_once('='))
        .filter(|(k, _)| allowed.contains(k))
        .filter(|(_, v)| v.chars().all(|c| c.is_ascii_digit()) && !v.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alias_record_round_trips_and_ignores_other_keys() {
        let allowed = [sysctl::IPV4_FORWARD, sysctl::IPV6_FORWARDING];
        let rec = alias_record(
            "netsetup:",
            &[
                (sysctl::IPV4_FORWARD, "0".into()),
                (sysctl::IPV6_FORWARDING, "1".into()),
            ],
        );
        assert_eq!(
            parse_alias_record(&rec, "netsetup:", &allowed),
            vec![
                (sysctl::IPV4_FORWARD.to_string(), "0".to_string()),
                (sysctl::IPV6_FORWARDING.to_string(), "1".to_string())
            ]
        );
        assert!(
            parse_alias_record(
                "netsetup: kernel/panic=1 net/ipv4/ip_forward=x",
                "netsetup:",
                &allowed
            )
            .is_empty()
        );
        assert!(parse_alias_record("someone else's alias", "netsetup:", &allowed).is_empty());
        assert_eq!(alias_record("netsetup:", &[]), "netsetup:");
    }

    #[test]
    fn interface_names_follow_linux_rules() {
        assert!(valid_ifname("eth0-nic"));
        assert!(!valid_ifname("eth0-with-a-very-long-name"));
        assert!(!valid_ifname("a/b"));
        assert!(!valid_ifname(""));
    }
}
