//! The few CRI v1 messages `gc` needs, declared by hand for prost. Names, field numbers
//! and types are exactly those of package `runtime.v1` in kubernetes/cri-api's
//! `pkg/apis/runtime/v1/api.proto`; fields we never read are left out, which protobuf
//! allows (unknown fields are skipped when decoding).

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
