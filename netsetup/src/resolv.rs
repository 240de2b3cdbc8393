//! The parts of `resolv.conf` the guest's DHCP answer needs: name servers and search domains.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

/// Name servers and search domains read from a `resolv.conf`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvConf {
    pub nameservers_v4: Vec<Ipv4Addr>,
    pub nameservers_v6: Vec<Ipv6Addr>,
    /// Domains of every `search` line, in order and lower-cased, as KubeVirt
    /// reads them (`ParseSearchDomains`, pkg/network/dns/resolveconf.go).
    pub search: Vec<String>,
}

impl ResolvConf {
    /// Reads and parses a `resolv.conf` file.
    pub fn read(path: &Path) -> std::io::Result<Self> {
        Ok(Self::parse(&std::fs::read_to_string(path)?))
    }

    /// Parses `resolv.conf` text. Lines that do not parse (unknown keywords, bad
    /// addresses) are skipped like the C resolver skips them.
    ///
    /// Search domains follow KubeVirt (every `search` line adds its domains,
    /// lower-cased: Kubernetes allows only lower case), with two deliberate
    /// differences, both for files KubeVirt would fail on: a comment after the
    /// domains is dropped (KubeVirt takes `#` as a domain, then refuses to start
    /// its DHCP server), and a trailing dot is removed (KubeVirt encodes it as an
    /// extra empty label in option 119).
    pub fn parse(text: &str) -> Self {
        let mut conf = ResolvConf::default();
        for line in text.lines() {
            let line = line.trim();
            if line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => {
                    // An IPv6 server may carry a zone ("fe80::1%eth0"); the zone is useless to the guest.
                    let addr = words.next().map(|w| w.split('%').next().unwrap_or(w));
                    match addr.and_then(|a| a.parse::<IpAddr>().ok()) {
                        Some(IpAddr::V4(v4)) => conf.nameservers_v4.push(v4),
                        Some(IpAddr::V6(v6)) => conf.nameservers_v6.push(v6),
                        None => {}
                    }
                }
                Some("search") => conf.search.extend(
                    words
                        .take_while(|w| !w.starts_with('#') && !w.starts_with(';'))
                        .map(|w| w.trim_end_matches('.').to_ascii_lowercase())
                        .filter(|w| !w.is_empty()),
                ),
                _ => {}
            }
        }
        conf
    }
}

/// The longest of `domains`, the first of equally long ones, as KubeVirt's
/// `dns.GetDomainName` (`pkg/network/dns/resolveconf.go`) picks the DHCP domain
/// name (option 15) and, among the `*.svc.*` domains, the namespace domain a
/// subdomain is put in front of.
pub fn longest_domain<'a>(domains: impl IntoIterator<Item = &'a String>) -> Option<&'a str> {
    let mut best: Option<&str> = None;
    for domain in domains {
        if best.is_none_or(|b| domain.len() > b.len()) {
            best = Some(domain);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubernetes_resolv_conf() {
        let conf = ResolvConf::parse(
            "# generated\nsearch default.svc.cluster.local svc.cluster.local cluster.local\n\
             nameserver 10.96.0.10\nnameserver fd00::a\nnameserver bogus\noptions ndots:5\n",
        );
        assert_eq!(conf.nameservers_v4, vec![Ipv4Addr::new(10, 96, 0, 10)]);
        assert_eq!(
            conf.nameservers_v6,
            vec!["fd00::a".parse::<Ipv6Addr>().unwrap()]
        );
        assert_eq!(
            conf.search,
            vec![
                "default.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local"
            ]
        );
        assert_eq!(
            longest_domain(&conf.search),
            Some("default.svc.cluster.local")
        );
    }

    #[test]
    fn every_search_line_adds_its_domains_lower_cased_without_comments() {
        let conf = ResolvConf::parse(
            "search a.example\n; comment\nsearch B.Example. c.example # trailing\n",
        );
        assert_eq!(conf.search, vec!["a.example", "b.example", "c.example"]);
    }

    /// Of equally long domains the first wins, as in KubeVirt (`len(d) > len(selected)`).
    #[test]
    fn the_first_of_equally_long_domains_is_the_longest() {
        let search = ["a.example", "b.example", "c.x"].map(String::from);
        assert_eq!(longest_domain(&search), Some("a.example"));
    }

    #[test]
    fn empty_file_has_nothing() {
        let conf = ResolvConf::parse("");
        assert!(conf.nameservers_v4.is_empty() && conf.search.is_empty());
        assert_eq!(longest_domain(&conf.search), None);
    }
}
