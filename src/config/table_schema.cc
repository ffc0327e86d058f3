#include "config/table_schema.h"

namespace hetps {

void ToSchemaProto(const TableConfig& table, rpc::TableSchema* schema) {
  schema->set_name(table.name);
  schema->set_kind(table.kind == TableKind::kSparse ? rpc::TABLE_KIND_SPARSE
                                                    : rpc::TABLE_KIND_DENSE);
  schema->set_dim(table.dim);
  schema->set_optimizer(table.optimizer.type);
}

}  // namespace hetps
