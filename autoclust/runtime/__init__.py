"""Running a Plan: cluster and segment runners, control flow, transfers, the interpreter."""
