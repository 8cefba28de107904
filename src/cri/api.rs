//! The few CRI v1 messages `gc` needs, declared by hand for prost. Names, field numbers
//! and types are exactly those of package `runtime.v1` in kubernetes/cri-api's
//! `pkg/apis/runtime/v1/api.proto`, kept beside this file as published (`api.proto`);
//! a unit test reads both files and fails on any difference. Fields we never read are
//! left out, which protobuf allows (unknown fields are skipped when decoding).

use std::collections::HashMap;

/// `rpc ListPodSandbox(ListPodSandboxRequest) returns (ListPodSandboxResponse)`.
pub const LIST_POD_SANDBOX: &str = "/runtime.v1.RuntimeService/ListPodSandbox";

/// `enum PodSandboxState`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum PodSandboxState {
    SandboxReady = 0,
    SandboxNotready = 1,
}

/// `message PodSandboxStateValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStateValue {
    #[prost(enumeration = "PodSandboxState", tag = "1")]
    pub state: i32,
}

/// `message PodSandboxFilter`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxFilter {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub state: Option<PodSandboxStateValue>,
    #[prost(map = "string, string", tag = "3")]
    pub label_selector: HashMap<String, String>,
}

/// `message ListPodSandboxRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    pub filter: Option<PodSandboxFilter>,
}

/// `message PodSandboxMetadata`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub namespace: String,
    #[prost(uint32, tag = "4")]
    pub attempt: u32,
}

/// `message PodSandbox` (labels, annotations and runtime_handler not needed).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandbox {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(enumeration = "PodSandboxState", tag = "3")]
    pub state: i32,
    #[prost(int64, tag = "4")]
    pub created_at: i64,
}

/// `message ListPodSandboxResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxResponse {
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<PodSandbox>,
}

/// `rpc Status(StatusRequest) returns (StatusResponse)`.
pub const STATUS: &str = "/runtime.v1.RuntimeService/Status";

/// `message StatusRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusRequest {
    #[prost(bool, tag = "1")]
    pub verbose: bool,
}

/// `message StatusResponse` (the `RuntimeStatus` conditions are not needed).
#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusResponse {
    #[prost(map = "string, string", tag = "2")]
    pub info: HashMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Every message, field and enum value declared in this file is the published
    /// definition's: same name, number, type and cardinality.
    #[test]
    fn declarations_match_the_published_api_proto() {
        let proto = include_str!("api.proto");
        let ours = include_str!("api.rs");
        assert!(proto.contains("\npackage runtime.v1;\n"));
        for (rpc, req, resp) in [
            (
                LIST_POD_SANDBOX,
                "ListPodSandboxRequest",
                "ListPodSandboxResponse",
            ),
            (STATUS, "StatusRequest", "StatusResponse"),
        ] {
            let name = rpc.rsplit('/').next().unwrap();
            assert!(rpc.starts_with("/runtime.v1.RuntimeService/"), "{rpc}");
            assert!(
                proto.contains(&format!("rpc {name}({req}) returns ({resp})")),
                "{rpc}"
            );
        }
        let mut checked = 0;
        for (kind, name, body) in blocks(ours, "pub ") {
            let published = blocks(proto, "")
                .into_iter()
                .find(|(k, n, _)| *k == kind && *n == name)
                .unwrap_or_else(|| panic!("{kind} {name} is not in api.proto"))
                .2;
            // Declarations one per line, their alignment spaces collapsed.
            let published: Vec<String> = published
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect();
            if kind == "enum" {
                for (variant, value) in rust_variants(&body) {
                    let line = format!("{} = {value};", shout(&variant));
                    assert!(published.contains(&line), "{name}: no `{line}`");
                    checked += 1;
                }
                continue;
            }
            for (attr, field) in rust_fields(&body) {
                let tag = attr
                    .split("tag = \"")
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap();
                let decl = published
                    .iter()
                    .find(|l| l.ends_with(&format!(" {field} = {tag};")))
                    .unwrap_or_else(|| panic!("{name}.{field} = {tag} is not in api.proto"));
                let proto_type = decl.trim_end_matches(&format!(" {field} = {tag};"));
                assert_eq!(
                    proto_type,
                    expected_proto_type(&attr, proto_type),
                    "{name}.{field}: prost({attr})"
                );
                checked += 1;
            }
        }
        assert!(checked >= 15, "only {checked} declarations found");
    }

    /// Top-level `message`/`enum` (`struct`/`enum` in Rust) blocks: (kind, name, body).
    fn blocks(text: &str, prefix: &str) -> Vec<(&'static str, String, String)> {
        let mut out = Vec::new();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            let kind = if line.starts_with(&format!("{prefix}struct "))
                || (prefix.is_empty() && line.starts_with("message "))
            {
                "message"
            } else if line.starts_with(&format!("{prefix}enum ")) {
                "enum"
            } else {
                continue;
            };
            let name = line
                .split_whitespace()
                .nth(if prefix.is_empty() { 1 } else { 2 });
            let name = name.unwrap().trim_end_matches('{').to_string();
            let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "}").collect();
            out.push((kind, name, body.join("\n")));
        }
        out
    }

    fn rust_fields(body: &str) -> Vec<(String, String)> {
        let lines: Vec<&str> = body.lines().map(str::trim).collect();
        lines
            .windows(2)
            .filter_map(|w| {
                let attr = w[0].strip_prefix("#[prost(")?.strip_suffix(")]")?;
                let field = w[1].strip_prefix("pub ")?.split(':').next()?;
                Some((attr.to_string(), field.to_string()))
            })
            .collect()
    }

    fn rust_variants(body: &str) -> Vec<(String, String)> {
        body.lines()
            .filter_map(|l| {
                let (v, n) = l.trim().trim_end_matches(',').split_once(" = ")?;
                Some((v.to_string(), n.to_string()))
            })
            .collect()
    }

    /// `SandboxNotready` → `SANDBOX_NOTREADY` (prost's naming, reversed).
    fn shout(variant: &str) -> String {
        let mut out = String::new();
        for (i, c) in variant.chars().enumerate() {
            if c.is_uppercase() && i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_uppercase());
        }
        out
    }

    /// The proto type a prost attribute stands for; a message field may be any
    /// message type, so it is taken from the declaration if it is not a scalar.
    fn expected_proto_type(attr: &str, declared: &str) -> String {
        let repeated = attr.contains("repeated");
        let base = if let Some(e) = attr.strip_prefix("enumeration = \"") {
            e.split('"').next().unwrap().to_string()
        } else if let Some(m) = attr.strip_prefix("map = \"") {
            format!("map<{}>", m.split('"').next().unwrap())
        } else if attr.starts_with("message") {
            let t = declared.trim_start_matches("repeated ");
            assert!(
                t.starts_with(char::is_uppercase),
                "{declared} is no message"
            );
            t.to_string()
        } else {
            attr.split(',').next().unwrap().to_string()
        };
        if repeated {
            format!("repeated {base}")
        } else {
            base
        }
    }

    /// Bytes as protoc-generated Go code writes them (field 1, length-delimited item;
    /// inside: id = field 1, metadata = field 2, state = field 3 varint 1, created_at =
    /// field 4, and an unknown field 7 (runtime_handler) that must be skipped).
    #[test]
    fn decodes_the_wire_format_of_runtime_v1() {
        let item: Vec<u8> = [
            &[0x0a, 0x03][..],
            b"abc",
            &[0x12, 0x04, 0x0a, 0x02],
            b"p1",
            &[0x18, 0x01, 0x20, 0x2a, 0x3a, 0x01],
            b"h",
        ]
        .concat();
        let mut bytes = vec![0x0a, item.len() as u8];
        bytes.extend(&item);
        let resp = ListPodSandboxResponse::decode(bytes.as_slice()).unwrap();
        assert_eq!(resp.items.len(), 1);
        let s = &resp.items[0];
        assert_eq!(s.id, "abc");
        assert_eq!(s.metadata.as_ref().unwrap().name, "p1");
        assert_eq!(s.state, PodSandboxState::SandboxNotready as i32);
        assert_eq!(s.created_at, 42);
        assert_eq!(ListPodSandboxRequest::default().encode_to_vec(), b"");
    }
}
