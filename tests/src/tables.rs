//! The loaded datapath's maps opened for writing, where a test plants an entry or the
//! benchmark fills a table as a busy host's would. The agent itself never writes these.

use anyhow::{Result, anyhow};
use aya::maps::{HashMap, Map, MapData, MapInfo};
use paceline::kernel::datapath::Datapath;
use paceline_common::maps::{FlowState, FlowTableKey, names};

/// The map `name` of `dp`'s egress program (found among the program's maps by name).
fn program_map(dp: &mut Datapath, name: &str) -> Result<MapData> {
    let ids = dp.tc_program()?.info()?.map_ids()?.unwrap_or_default();
    for id in ids {
        if MapInfo::from_id(id)?.name_as_str() == Some(name) {
            return Ok(MapData::from_id(id)?);
        }
    }
    Err(anyhow!("map {name} missing from the loaded program"))
}

/// The flow table of `dp`'s egress program.
pub fn flow_table(dp: &mut Datapath) -> Result<HashMap<MapData, FlowTableKey, FlowState>> {
    Ok(HashMap::try_from(Map::LruHashMap(program_map(
        dp,
        names::FLOWS,
    )?))?)
}

/// The per-class (and, before the ledger, per-level) counters of `dp`'s egress program, one
/// value per CPU: a test plants what an older datapath would have counted.
pub fn stats(dp: &mut Datapath) -> Result<aya::maps::PerCpuArray<MapData, paceline_common::maps::Counters>> {
    Ok(aya::maps::PerCpuArray::try_from(Map::PerCpuArray(program_map(
        dp,
        names::STATS,
    )?))?)
}
