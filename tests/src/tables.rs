//! The loaded datapath's maps opened for writing, where a test plants an entry or the
//! benchmark fills a table as a busy host's would. The agent itself never writes these.

use anyhow::{Result, anyhow};
use aya::maps::{HashMap, Map, MapData, MapInfo};
use paceline::kernel::datapath::Datapath;
use paceline_common::maps::{FlowState, FlowTableKey, names};

/// The flow table of `dp`'s egress program (found among the program's maps by name).
pub fn flow_table(dp: &mut Datapath) -> Result<HashMap<MapData, FlowTableKey, FlowState>> {
    let ids = dp.tc_program()?.info()?.map_ids()?.unwrap_or_default();
    for id in ids {
        if MapInfo::from_id(id)?.name_as_str() == Some(names::FLOWS) {
            return Ok(HashMap::try_from(Map::LruHashMap(MapData::from_id(id)?))?);
        }
    }
    Err(anyhow!("map {} missing from the loaded program", names::FLOWS))
}

/// The per-class (and, before the ledger, per-level) counters of `dp`'s egress program, one
/// value per CPU: a test plants what an older datapath would have counted.
pub fn stats(dp: &mut Datapath) -> Result<aya::maps::PerCpuArray<MapData, paceline_common::maps::Counters>> {
    let ids = dp.tc_program()?.info()?.map_ids()?.unwrap_or_default();
    for id in ids {
        if MapInfo::from_id(id)?.name_as_str() == Some(names::STATS) {
            return Ok(aya::maps::PerCpuArray::try_from(Map::PerCpuArray(
                MapData::from_id(id)?,
            ))?);
        }
    }
    Err(anyhow!("map {} missing from the loaded program", names::STATS))
}
