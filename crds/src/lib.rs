//! The switchyard.dev/v1alpha1 API (filled in by the API issue).
