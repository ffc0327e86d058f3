// gmock stubs of every service (the generated header has no include guard,
// so everything includes it through this one).
#pragma once

#include "hetps_mock.grpc.pb.h"
