// The stages-per-rank rule of the schedule table (schedule.h's kSchedules), shared by make_schedule
// and make_zero_bubble_schedule. Internal.
#pragma once

#include "gpt2p/pipeline/plan/schedule.h"

namespace gpt2p::pipeline::detail {

// Throws gpt2p::Error when `schedule` runs one stage per rank and stages_per_rank is not 1 (the
// generators of the other kinds check their stages per rank themselves).
void check_stages_per_rank(const ScheduleInfo& schedule, int stages_per_rank);

}  // namespace gpt2p::pipeline::detail
