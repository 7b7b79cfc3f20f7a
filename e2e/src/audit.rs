//! The API server's audit log (metadata level for writes), so tests can prove
//! the order in which things happened in the cluster.

use std::path::Path;

use serde::Deserialize;

use crate::error::{E2eError, Result};

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditObjectReference {
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub api_group: Option<String>,
    #[serde(default)]
    pub subresource: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditUser {
    #[serde(default)]
    pub username: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditResponseStatus {
    #[serde(default)]
    pub code: Option<u16>,
}

/// One audit event (the fields tests use).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    pub stage: String,
    pub verb: String,
    #[serde(default)]
    pub object_ref: Option<AuditObjectReference>,
    pub user: AuditUser,
    #[serde(default)]
    pub response_status: Option<AuditResponseStatus>,
    /// RFC 3339 with microseconds, as the API server writes it (sorts as text).
    pub stage_timestamp: String,
    /// The client's User-Agent.
    #[serde(default)]
    pub user_agent: Option<String>,
}

impl AuditEvent {
    /// Whether this is a completed, successful `verb` on `resource` named `name`.
    pub fn is_successful(&self, verb: &str, resource: &str, name: &str) -> bool {
        self.stage == "ResponseComplete"
            && self.verb == verb
            && self
                .response_status
                .as_ref()
                .and_then(|status| status.code)
                .is_some_and(|code| code < 300)
            && self.object_ref.as_ref().is_some_and(|object| {
                object.resource == resource
                    && object.name.as_deref() == Some(name)
                    && object.subresource.is_none()
            })
    }
}

/// Every audit event in the log, in the order written; lines that are not
/// events (e.g. a line being written) are skipped.
pub fn read_audit_events(path: &Path) -> Result<Vec<AuditEvent>> {
    let text = std::fs::read_to_string(path).map_err(|source| E2eError::ReadFile {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(parse_audit_events(&text))
}

pub fn parse_audit_events(text: &str) -> Vec<AuditEvent> {
    text.lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/kube-system/pods/kube-proxy-x","verb":"delete","user":{"username":"switchyard-e2e-admin","groups":["system:masters"]},"objectRef":{"resource":"pods","namespace":"kube-system","name":"kube-proxy-x","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-11-22T01:28:44.100000Z","stageTimestamp":"2026-11-22T01:28:44.123456Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"b","stage":"ResponseComplete","verb":"create","user":{"username":"system:node:node-2"},"objectRef":{"resource":"pods","namespace":"kube-system","name":"kube-proxy-x","subresource":"status"},"responseStatus":{"code":201},"stageTimestamp":"2026-11-22T01:28:45.000001Z"}
{"kind":"Event","trunc"#;

    #[test]
    fn events_are_parsed_and_a_torn_line_is_skipped() {
        let events = parse_audit_events(LOG);
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].user.username, "switchyard-e2e-admin");
        assert!(events[0].is_successful("delete", "pods", "kube-proxy-x"));
        assert!(
            !events[1].is_successful("create", "pods", "kube-proxy-x"),
            "a subresource is another object"
        );
        assert!(events[0].stage_timestamp < events[1].stage_timestamp);
    }
}
