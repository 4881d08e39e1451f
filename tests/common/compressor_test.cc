#include "common/compressor.h"
#include "gtest/gtest.h"
TEST(Compressor, Placeholder) {}
