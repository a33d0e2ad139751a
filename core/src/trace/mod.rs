//! Kernel tracing sessions over tracefs, as a sans-IO machine (issue 5).
