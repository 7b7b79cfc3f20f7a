//! The Kubernetes client every part of the operator uses, and a User-Agent naming Switchyard
//! and its version on every request, so the API server's audit log and metrics say who did what.
//!
//! The operator reaches the API server the way the agents do: at the address the chart's
//! `apiServer.host`/`apiServer.port` give (`--api-server-address`), with the pod's service
//! account token and CA. In-cluster configuration would go through the `kubernetes` Service,
//! the very Service a transition moves between dataplanes, so it is only the fallback when no
//! address is given (and then the preflight refuses every transition anyway). A kubeconfig is
//! used when the operator runs outside a cluster (no service account mounted).

use http::{HeaderName, HeaderValue};
use kube::{Client, Config};

use crate::error::Error;

/// `switchyard-operator/<version>`.
pub fn user_agent() -> String {
    format!("switchyard-operator/{}", env!("CARGO_PKG_VERSION"))
}

/// Adds the User-Agent header to every request made with `config`.
pub fn with_user_agent(mut config: Config) -> Result<Config, Error> {
    let value = HeaderValue::from_str(&user_agent()).map_err(|error| Error::ConfigureClient {
        reason: format!("the User-Agent is not a valid header value: {error}"),
    })?;
    config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    config
        .headers
        .push((HeaderName::from_static("user-agent"), value));
    Ok(config)
}

/// How the operator's client reaches the API server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiServerRoute {
    /// The address given (`host:port`), with the service account's token and CA: independent
    /// of the dataplane a transition changes.
    Address(String),
    /// Inferred configuration: a kubeconfig, else in-cluster configuration, which in a pod
    /// goes through the `kubernetes` Service (the Service a transition migrates).
    Inferred,
}

impl ApiServerRoute {
    /// The route for the address given on the command line: that address when there is one,
    /// inferred configuration otherwise. An empty address counts as none (the chart leaves
    /// `apiServer.host` empty by default).
    pub fn for_address(api_server_address: Option<&str>) -> Self {
        match api_server_address.map(str::trim) {
            Some(address) if !address.is_empty() => Self::Address(address.to_owned()),
            _ => Self::Inferred,
        }
    }
}

/// A client for `route`, with the User-Agent. With an address, the service account's token and
/// CA are loaded as in-cluster configuration would, and only the URL differs; without a
/// service account (outside a cluster) the inferred configuration (kubeconfig) is used and the
/// route returned says so.
pub async fn client(route: &ApiServerRoute) -> Result<(Client, ApiServerRoute), Error> {
    if let ApiServerRoute::Address(address) = route {
        match Config::incluster_dns() {
            Ok(in_cluster) => {
                let config = with_api_server_address(in_cluster, address)?;
                return Ok((client_from(config)?, route.clone()));
            }
            Err(error) => tracing::warn!(
                %error,
                %address,
                "no service account to reach the API server address with; using the inferred configuration (kubeconfig)"
            ),
        }
    }
    let config = Config::infer()
        .await
        .map_err(|error| Error::ConfigureClient {
            reason: error.to_string(),
        })?;
    Ok((client_from(config)?, ApiServerRoute::Inferred))
}

/// `config` (credentials, CA, timeouts) pointed at `address` (`host:port`, `[v6]:port`)
/// instead of where it pointed.
pub fn with_api_server_address(mut config: Config, address: &str) -> Result<Config, Error> {
    config.cluster_url =
        format!("https://{address}")
            .parse()
            .map_err(|error| Error::ConfigureClient {
                reason: format!("the API server address {address:?} is not host:port: {error}"),
            })?;
    let has_path = !matches!(config.cluster_url.path(), "" | "/");
    if config.cluster_url.port_u16().is_none() || has_path {
        return Err(Error::ConfigureClient {
            reason: format!("the API server address {address:?} is not host:port"),
        });
    }
    Ok(config)
}

/// A client from `config`, with the User-Agent.
pub fn client_from(config: Config) -> Result<Client, Error> {
    Client::try_from(with_user_agent(config)?).map_err(|error| Error::ConfigureClient {
        reason: error.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use kube::Api;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn an_api_server_address_given_is_the_route() {
        assert_eq!(
            ApiServerRoute::for_address(Some("10.99.0.1:6443")),
            ApiServerRoute::Address("10.99.0.1:6443".into())
        );
    }

    #[test]
    fn without_an_address_the_route_is_the_inferred_configuration() {
        assert_eq!(ApiServerRoute::for_address(None), ApiServerRoute::Inferred);
        assert_eq!(
            ApiServerRoute::for_address(Some("  ")),
            ApiServerRoute::Inferred
        );
    }

    #[test]
    fn the_address_replaces_only_the_url_and_keeps_the_service_accounts_credentials() {
        let mut in_cluster = Config::new("https://kubernetes.default.svc".parse().unwrap());
        in_cluster.root_cert = Some(vec![vec![1, 2, 3]]);
        in_cluster.auth_info.token_file =
            Some("/var/run/secrets/kubernetes.io/serviceaccount/token".into());
        in_cluster.default_namespace = "switchyard-system".into();
        for (address, url) in [
            ("10.99.0.1:6443", "https://10.99.0.1:6443/"),
            ("[fd00::1]:6443", "https://[fd00::1]:6443/"),
            (
                "api.example.internal:443",
                "https://api.example.internal:443/",
            ),
        ] {
            let config = with_api_server_address(in_cluster.clone(), address).unwrap();
            assert_eq!(config.cluster_url.to_string(), url);
            assert_eq!(config.root_cert, in_cluster.root_cert);
            assert_eq!(config.auth_info.token_file, in_cluster.auth_info.token_file);
            assert_eq!(config.default_namespace, "switchyard-system");
        }
    }

    #[test]
    fn an_address_without_a_port_or_with_a_path_is_refused() {
        let in_cluster = Config::new("https://kubernetes.default.svc".parse().unwrap());
        for address in ["10.99.0.1", "10.99.0.1:6443/api", "not an address"] {
            assert!(
                with_api_server_address(in_cluster.clone(), address).is_err(),
                "{address}"
            );
        }
    }

    #[tokio::test]
    async fn every_request_names_switchyard_and_its_version() {
        // A fake API server on loopback that records the request head and answers 404.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buffer = [0u8; 1024];
            while !head.windows(4).any(|window| window == b"\r\n\r\n") {
                let read = stream.read(&mut buffer).await.unwrap();
                assert_ne!(
                    read, 0,
                    "the client closed before sending a full request head"
                );
                head.extend_from_slice(&buffer[..read]);
            }
            let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"nodes \"x\" not found"}"#;
            let response = format!(
                "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(response.as_bytes()).await.unwrap();
            String::from_utf8(head).unwrap()
        });

        let config = Config::new(format!("http://{address}").parse().unwrap());
        let client = client_from(config).unwrap();
        let answer = Api::<Node>::all(client).get_opt("x").await.unwrap();
        assert_eq!(answer, None);

        let head = server.await.unwrap().to_ascii_lowercase();
        let user_agents: Vec<&str> = head
            .lines()
            .filter(|line| line.starts_with("user-agent:"))
            .collect();
        assert_eq!(
            user_agents,
            vec![format!(
                "user-agent: switchyard-operator/{}",
                env!("CARGO_PKG_VERSION")
            )
            .as_str()]
        );
    }
}
