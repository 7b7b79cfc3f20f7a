//! The Switchyard node agent (filled in by the datapath and agent issues).
