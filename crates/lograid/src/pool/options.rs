//! The run-time options of an opened pool (`PoolOptions`) and the cleaner's
//! victim policy: what a caller may tune without changing the pool on disk.

/// Runtime options for an opened pool.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Threads writing and reading members.
    pub io_threads: usize,
    /// Log blocks written between automatic checkpoints (bounds recovery time).
    pub checkpoint_interval_blocks: u64,
    /// Rows sealed but not yet written, at most (bounds memory).
    pub max_inflight_rows: usize,
    /// Bytes of rows sealed but not yet written, at most (bounds memory).
    pub max_inflight_bytes: usize,
    /// Start a background thread that cleans before space runs low.
    pub background_cleaner: bool,
    /// How the cleaner picks the segment to empty.
    pub cleaner_policy: CleanerPolicy,
    /// Discard segments on the members when they become free (punch holes
    /// in file members, BLKDISCARD on block devices), so thin or flash
    /// backing storage gets the space back.
    pub discard: bool,
    /// Share of the time a rebuild or rebalance may take while users are
    /// doing I/O (0.05 to 1; it runs flat out when they are idle).
    pub reshape_share: f64,
    /// Blocks with sub-block writes held in memory (4 KiB each), at most;
    /// they are merged into their blocks in the background, by a writer
    /// that finds the table full, and by every flush (at least 1).
    pub max_overlays: usize,
    /// Start a background thread that merges sub-block writes into their
    /// blocks (keeping the table at most a quarter full).
    pub background_resolver: bool,
}

/// How the cleaner chooses its victim segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CleanerPolicy {
    /// The segment with the fewest live blocks.
    Greedy,
    /// The segment with the highest (1-u)/u * age: free space gained per
    /// block moved, weighted by how long the segment has gone unchanged
    /// since it was sealed (after Rosenblum and Ousterhout's LFS; the
    /// (1-u)/u form did better than (1-u)/(1+u) in simulation). Cold
    /// segments are cleaned at a higher utilization than hot ones, which
    /// are left to empty by themselves. Only segments that gain at least
    /// half what the emptiest would are considered, so that every pass
    /// makes progress in a nearly full pool; writers out of room pick by
    /// the same rule.
    #[default]
    CostBenefit,
}

impl CleanerPolicy {
    pub fn name(self) -> &'static str {
        match self {
            CleanerPolicy::Greedy => "greedy",
            CleanerPolicy::CostBenefit => "cost-benefit",
        }
    }
}

impl std::str::FromStr for CleanerPolicy {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "greedy" => Ok(CleanerPolicy::Greedy),
            "cost-benefit" => Ok(CleanerPolicy::CostBenefit),
            _ => Err(format!(
                "unknown cleaner policy '{s}' (greedy, cost-benefit)"
            )),
        }
    }
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            io_threads: 32,
            checkpoint_interval_blocks: 1 << 18,
            max_inflight_rows: 64,
            max_inflight_bytes: 256 << 20,
            background_cleaner: true,
            cleaner_policy: CleanerPolicy::default(),
            discard: false,
            reshape_share: 0.5,
            max_overlays: 4096,
            background_resolver: true,
        }
    }
}
