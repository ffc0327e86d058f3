#include "metrics/families.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <string>

#include "gmock/gmock.h"
#include "metrics/http_endpoint.h"

namespace hetps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

rpc::StatusResponse TwoWorkersOneServer() {
  rpc::StatusResponse status;
  status.set_window(7);
  status.set_chunks_given(3);
  status.set_chunks_total(12);
  for (uint32_t r : {0u, 1u}) {
    rpc::WorkerStatus* w = status.add_workers();
    w->set_rank(r);
    w->set_live(r == 0);
    w->set_staleness(r);
    w->mutable_progress()->set_samples_per_s(r == 0 ? 4000 : 1200.5);
    w->mutable_progress()->set_busy_fraction(0.97);
    w->mutable_progress()->set_batch_size(r == 0 ? 96 : 32);
    w->mutable_progress()->set_samples(12345);
    w->mutable_progress()->set_codec(r == 0 ? "int8" : "");
    if (r == 0) {
      w->mutable_progress()->set_test_auc(0.79);
      w->mutable_progress()->set_test_auc_at_s(4.0);
    }
  }
  rpc::ServerStatus* s = status.add_servers();
  s->set_rank(1);
  s->set_reachable(true);
  s->mutable_stats()->set_queue_length(5);
  s->mutable_stats()->set_applies_by_window(9);
  rpc::TableInfo* t = s->add_tables();
  t->mutable_schema()->set_name("emb");
  t->set_rows(1411);
  t->set_plans_kept(30);
  t->set_plans_found(25);
  rpc::LatencyHistogram* h = s->mutable_pull_latency();
  h->add_upper_s(0.001);
  h->add_upper_s(0.01);
  h->add_counts(3);  // ≤ 1 ms
  h->add_counts(2);  // ≤ 10 ms
  h->add_counts(1);  // more
  h->set_sum_s(0.5);
  // Two buckets served; a hot-row cache's record.
  rpc::AccessStats* a = s->mutable_access();
  for (uint32_t b : {3u, 9u}) {
    a->add_buckets(b);
    a->add_pulled_rows(b * 10);
    a->add_pushed_rows(b);
    a->add_bytes(b * 11 * 32);
    a->add_service_ns(b * 1000);
  }
  a->set_service_s(0.25);
  s->mutable_stats()->set_read_lag_bound(8);
  s->mutable_stats()->set_cached_pushes(40);
  status.mutable_workers(0)->mutable_progress()->set_pulled_rows(700);
  status.mutable_workers(0)->mutable_progress()->set_cached_rows(300);
  rpc::Diagnostic* d = status.add_diagnostics();
  d->set_kind("slow_worker");
  d->set_subject("worker 1");
  d->set_active(true);
  status.mutable_placement()->set_at_s(12);
  status.mutable_placement()->set_max_over_mean(1.5);
  status.mutable_placement()->set_moves(40);
  return status;
}

TEST(MetricsTest, JobSeriesCarryTheStatusWithWorkerLabels) {
  MetricFamilies families;
  AddJobFamilies(TwoWorkersOneServer(), families);
  const std::string text = Exposition(families);
  EXPECT_THAT(text, HasSubstr("# TYPE hetps_window gauge\nhetps_window 7\n"));
  EXPECT_THAT(text, HasSubstr("hetps_data_chunks_given 3\n"));
  EXPECT_THAT(text, HasSubstr("hetps_data_chunks 12\n"));
  EXPECT_THAT(text, HasSubstr("hetps_diagnostic{kind=\"slow_worker\",subject="
                              "\"worker 1\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("hetps_test_auc 0.79\n"));
  EXPECT_THAT(text, HasSubstr("hetps_placement_load_max_over_mean 1.5\n"));
  EXPECT_THAT(text, HasSubstr("hetps_placement_planned_moves 40\n"));
  EXPECT_THAT(
      text, HasSubstr("hetps_worker_samples_per_second{worker=\"0\"} 4000\n"));
  EXPECT_THAT(
      text,
      HasSubstr("hetps_worker_samples_per_second{worker=\"1\"} 1200.5\n"));
  EXPECT_THAT(text, HasSubstr("hetps_worker_live{worker=\"1\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("hetps_worker_batch_size{worker=\"1\"} 32\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE hetps_worker_samples_total counter\n"));
  EXPECT_THAT(text,
              HasSubstr("hetps_worker_cached_rows_total{worker=\"0\"} 300\n"));
  EXPECT_THAT(text,
              HasSubstr("hetps_worker_pulled_rows_total{worker=\"0\"} 700\n"));
  EXPECT_THAT(
      text,
      HasSubstr("hetps_worker_codec_info{worker=\"0\",codec=\"int8\"} 1\n"));
  // No codec yet: no codec series for worker 1.
  EXPECT_THAT(text, Not(HasSubstr("codec_info{worker=\"1\"")));
  // Servers export their own series, not the job's endpoint.
  EXPECT_THAT(text, Not(HasSubstr("hetps_server_")));
}

TEST(MetricsTest, ServerSeriesHaveServerAndTableLabelsAndAHistogram) {
  MetricFamilies families;
  AddServerFamilies(TwoWorkersOneServer().servers(0), families);
  const std::string text = Exposition(families);
  EXPECT_THAT(text, HasSubstr("hetps_server_queue_length{server=\"1\"} 5\n"));
  EXPECT_THAT(text, HasSubstr("hetps_server_queue_applies_total{server=\"1\","
                              "trigger=\"window\"} 9\n"));
  EXPECT_THAT(text,
              HasSubstr("hetps_table_rows{server=\"1\",table=\"emb\"} 1411\n"));
  EXPECT_THAT(text, HasSubstr("hetps_table_key_plans_total{server=\"1\","
                              "table=\"emb\",event=\"kept\"} 30\n"));
  EXPECT_THAT(text, HasSubstr("hetps_table_key_plans_total{server=\"1\","
                              "table=\"emb\",event=\"found\"} 25\n"));
  // Buckets are cumulative, the last one +Inf holds them all.
  EXPECT_THAT(text, HasSubstr("hetps_server_pull_latency_seconds_bucket{"
                              "server=\"1\",le=\"0.001\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("hetps_server_pull_latency_seconds_bucket{"
                              "server=\"1\",le=\"0.01\"} 5\n"));
  EXPECT_THAT(text, HasSubstr("hetps_server_pull_latency_seconds_bucket{"
                              "server=\"1\",le=\"+Inf\"} 6\n"));
  EXPECT_THAT(
      text,
      HasSubstr("hetps_server_pull_latency_seconds_count{server=\"1\"} 6\n"));
  // What its requests touched, summed over its buckets; the cache's record
  // where workers keep hot rows.
  EXPECT_THAT(text, HasSubstr("hetps_server_rows_total{server=\"1\","
                              "direction=\"pulled\"} 120\n"));
  EXPECT_THAT(text, HasSubstr("hetps_server_rows_total{server=\"1\","
                              "direction=\"pushed\"} 12\n"));
  EXPECT_THAT(text,
              HasSubstr("hetps_server_row_bytes_total{server=\"1\"} 4224\n"));
  EXPECT_THAT(
      text,
      HasSubstr("hetps_server_service_seconds_total{server=\"1\"} 0.25\n"));
  EXPECT_THAT(text, HasSubstr("hetps_server_read_lag_bound{server=\"1\"} 8\n"));
  EXPECT_THAT(text,
              HasSubstr("hetps_server_cached_pushes_total{server=\"1\"} 40\n"));
  // A push histogram that was never filled in is left out, not invented.
  EXPECT_THAT(text, Not(HasSubstr("push_latency")));
}

TEST(MetricsTest, AnUnreachableServerIsDownAndNothingElse) {
  rpc::ServerStatus server;
  server.set_rank(2);
  MetricFamilies families;
  AddServerFamilies(server, families);
  EXPECT_EQ(Exposition(families),
            "# HELP hetps_server_up 1 when the server answered the last poll\n"
            "# TYPE hetps_server_up gauge\n"
            "hetps_server_up{server=\"2\"} 0\n");
}

TEST(HttpEndpointTest, ServesRoutesAndAsksForTheToken) {
  int calls = 0;
  auto endpoint = HttpEndpoint::Start(
      "127.0.0.1", 0, "s3cret",
      {{"/metrics",
        [&] {
          ++calls;
          return HttpReply{.body = "hetps_window 3\n"};
        }}},
      {{"/", [] { return HttpReply{.body = "the page"}; }}});
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  httplib::Client client("127.0.0.1", (*endpoint)->port());
  auto refused = client.Get("/metrics");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  EXPECT_EQ(calls, 0);
  auto ok = client.Get("/metrics", {{"Authorization", "Bearer s3cret"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->body, "hetps_window 3\n");
  // A browser passes the token in the query; a wrong one is refused.
  auto query = client.Get("/metrics?token=s3cret");
  ASSERT_TRUE(query);
  EXPECT_EQ(query->status, 200);
  auto wrong = client.Get("/metrics?token=guess");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  // The dashboard's page holds no data: served without the token.
  auto page = client.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->body, "the page");
  auto missing = client.Get("/nope", {{"Authorization", "Bearer s3cret"}});
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(calls, 2);
}

TEST(HttpEndpointTest, ABusyPortIsAClearError) {
  auto first = HttpEndpoint::Start("127.0.0.1", 0, "", {});
  ASSERT_TRUE(first.ok());
  auto second = HttpEndpoint::Start("127.0.0.1", (*first)->port(), "", {});
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("metrics: cannot listen on 127.0.0.1:"));
}

}  // namespace
}  // namespace hetps
