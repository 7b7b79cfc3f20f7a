//! Prints both CustomResourceDefinitions as multi-document YAML:
//! `cargo run -p switchyard-crds --bin crdgen > crds/switchyard.dev_crds.yaml`.

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    match switchyard_crds::crds_yaml() {
        Ok(yaml) => match std::io::stdout().write_all(yaml.as_bytes()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("failed to write the CRDs to stdout: {error}");
                ExitCode::FAILURE
            }
        },
        Err(error) => {
            eprintln!("{error}");
            ExitCode::FAILURE
        }
    }
}
