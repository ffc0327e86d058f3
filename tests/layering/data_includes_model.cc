// Readers do not know the models that consume their batches.
#include "model/model.h"
