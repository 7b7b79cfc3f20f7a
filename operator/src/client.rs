//! The Kubernetes client every part of the operator uses: inferred configuration (kubeconfig,
//! else the in-cluster service account) and a User-Agent naming Switchyard and its version on
//! every request, so the API server's audit log and metrics say who did what.

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

/// A client from the inferred configuration, with the User-Agent.
pub async fn client() -> Result<Client, Error> {
    let config = Config::infer()
        .await
        .map_err(|error| Error::ConfigureClient {
            reason: error.to_string(),
        })?;
    client_from(config)
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
