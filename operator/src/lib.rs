//! The Switchyard operator (filled in by the planner and operator issues).
