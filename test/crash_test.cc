#include "gtest/gtest.h"
TEST(CrashTest, Placeholder) {}
