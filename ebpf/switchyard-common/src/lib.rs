#![no_std]
//! Shared `#[repr(C)]` map types (filled in by the datapath issue).
