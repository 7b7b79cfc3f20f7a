//! End-to-end harness (filled in by the e2e cluster issue).
