//! CIDR parsing and arithmetic.
//!
//! Every CIDR that enters the core is parsed once, here, into a [`Cidr`] whose
//! address is masked to its network address. Two spellings of the same block
//! (`10.000.1.0/24` and `10.0.1.0/24`, or `fd00:0::/64` and `fd00::/64`)
//! therefore compare equal, which upstream's string comparison does not do.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The address family of a CIDR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IpFamily {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        })
    }
}

/// Why a string is not a CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// No `/` separating address and prefix length.
    #[error("{0:?} is not a CIDR: missing '/<prefix length>'")]
    MissingPrefix(String),
    /// The address part is not an IPv4 or IPv6 address.
    #[error("{0:?} is not a CIDR: invalid IP address")]
    BadAddress(String),
    /// The prefix length is not a number or too long for the family.
    #[error("{0:?} is not a CIDR: invalid prefix length")]
    BadPrefix(String),
}

/// A parsed, normalised CIDR block: the network address and the prefix length.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Builds a CIDR, masking host bits. Fails if the prefix is too long.
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self, CidrError> {
        let max = match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        if prefix > max {
            return Err(CidrError::BadPrefix(format!("{addr}/{prefix}")));
        }
        Ok(Self {
            addr: mask(addr, prefix),
            prefix,
        })
    }

    /// Parses like Go's `netutils.ParseCIDRSloppy`: IPv4 octets may carry
    /// leading zeros (`010.0.0.0/8` is `10.0.0.0/8`, decimal, never octal),
    /// host bits are masked away.
    pub fn parse(s: &str) -> Result<Self, CidrError> {
        let t = s.trim();
        let (a, p) = t
            .split_once('/')
            .ok_or_else(|| CidrError::MissingPrefix(s.to_string()))?;
        let addr = parse_ip_sloppy(a).ok_or_else(|| CidrError::BadAddress(s.to_string()))?;
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(CidrError::BadPrefix(s.to_string()));
        }
        let prefix: u8 = p.parse().map_err(|_| CidrError::BadPrefix(s.to_string()))?;
        Self::new(addr, prefix).map_err(|_| CidrError::BadPrefix(s.to_string()))
    }

    /// The network (first) address.
    pub fn network(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.prefix
    }

    /// The address family.
    pub fn family(&self) -> IpFamily {
        match self.addr {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    /// The last address of the block (the broadcast address for IPv4).
    pub fn last(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(a) => {
                // `checked_shr` because a /32 shifts by the full width.
                let host = u32::MAX.checked_shr(u32::from(self.prefix)).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(a) | host))
            }
            IpAddr::V6(a) => {
                let host = u128::MAX.checked_shr(u32::from(self.prefix)).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) | host))
            }
        }
    }

    /// Whether `ip` lies inside this block. Families never match each other.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => {
                mask(ip, self.prefix) == self.addr
            }
            _ => false,
        }
    }

    /// Whether `other` lies entirely inside this block.
    pub fn covers(&self, other: &Cidr) -> bool {
        other.prefix >= self.prefix && self.contains(other.addr)
    }

    /// Whether the two blocks share any address.
    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.covers(other) || other.covers(self)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl fmt::Debug for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Cidr {
    type Err = CidrError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Cidr::parse(&s).map_err(serde::de::Error::custom)
    }
}

fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & m))
        }
        IpAddr::V6(a) => {
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & m))
        }
    }
}

/// Parses an IP address, tolerating leading zeros in IPv4 octets the way
/// Go's `netutils.ParseIPSloppy` does (Rust's parser rejects them).
pub fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if s.contains(':') {
        return None;
    }
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for o in &mut octets {
        let p = parts.next()?;
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *o = p.parse().ok()?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some(IpAddr::V4(Ipv4Addr::from(octets)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_zeros_and_ipv6_spellings_normalise() {
        assert_eq!(
            Cidr::parse("10.000.1.0/24").unwrap(),
            Cidr::parse("10.0.1.0/24").unwrap()
        );
        assert_eq!(
            Cidr::parse("fd00:0:0::/64").unwrap(),
            Cidr::parse("FD00::/64").unwrap()
        );
        assert_eq!(
            Cidr::parse("10.0.1.7/24").unwrap().to_string(),
            "10.0.1.0/24"
        );
    }

    #[test]
    fn rejects_garbage() {
        for s in [
            "",
            "10.0.0.0",
            "10.0.0.0/33",
            "10.0.0/8",
            "abc/8",
            "10.0.0.0/-1",
            "::/129",
            "10.0.0.256/8",
            "10.0.0.0/ 8",
            "10.0.0.0/8/8",
        ] {
            assert!(Cidr::parse(s).is_err(), "{s:?} should not parse");
        }
    }

    #[test]
    fn first_and_last_addresses() {
        let c = Cidr::parse("10.244.0.0/14").unwrap();
        assert_eq!(c.last().to_string(), "10.247.255.255");
        let z = Cidr::parse("0.0.0.0/0").unwrap();
        assert_eq!(z.last().to_string(), "255.255.255.255");
        let v6 = Cidr::parse("a00:100::/24").unwrap();
        assert_eq!(v6.network().to_string(), "a00:100::");
        assert_eq!(
            v6.last().to_string(),
            "a00:1ff:ffff:ffff:ffff:ffff:ffff:ffff"
        );
    }

    #[test]
    fn host_route_last_address_is_itself_not_a_shift_overflow() {
        // Regression: a /32 or /128 route in the table (a VIP, a host route)
        // made `last()` shift by the full width and killed the controller.
        let h4 = Cidr::parse("10.244.1.7/32").unwrap();
        assert_eq!(h4.network().to_string(), "10.244.1.7");
        assert_eq!(h4.last().to_string(), "10.244.1.7");
        let h6 = Cidr::parse("fd00::7/128").unwrap();
        assert_eq!(h6.last().to_string(), "fd00::7");
        let all6 = Cidr::parse("::/0").unwrap();
        assert_eq!(
            all6.last().to_string(),
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
        );
        let c = Cidr::parse("10.244.0.0/16").unwrap();
        assert!(c.covers(&h4) && c.contains(h4.last()));
        assert!(!h4.covers(&c) && h4.overlaps(&c));
    }

    #[test]
    fn families_never_cross_match() {
        let v4 = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(!v4.contains("::1".parse().unwrap()));
        assert!(v4.covers(&Cidr::parse("10.0.0.0/8").unwrap()));
        assert!(!v4.covers(&Cidr::parse("::/0").unwrap()));
    }
}
