// A configured table as the wire describes it (rpc::TableSchema): what a node
// declares when it registers and what a server reports in GetTableInfo, so
// that the coordinator can refuse a node whose tables differ from the job's.
#pragma once

#include "hetps.pb.h"
#include "hetps/config.h"

namespace hetps {

void ToSchemaProto(const TableConfig& table, rpc::TableSchema* schema);

}  // namespace hetps
