-- Views over one tokencredit run directory. The responses, credits and nodes placeholders are replaced
-- by table expressions over exactly the part files its manifest lists (pipeline/dataset/query.py).
-- responses: the stored rows plus GDPO's batch step over the whole run (method.md section 1),
-- never over a shard: gdpo_scale c and gdpo_shift m come from every credited response's gdpo_sum
-- S[i] ({batch} step, ddof {batch_ddof}, eps {batch_eps}, the run's GdpoOptions), and
-- adv_gdpo = c (S - m), adv_mrtpo[t] = c (mrtpo_sum[t] - m), adv_mc[t] = c (mc_sum[t] - m),
-- adv_p2t[t] = adv_gdpo + p2t_alpha p2t_reward[t].
-- 'std' weighs each response 1 and divides by std + eps; 'whiten' (verl) weighs it by its tokens
-- and divides by sqrt(var + eps); 'none' keeps S.
CREATE OR REPLACE VIEW responses AS
    WITH stored AS (
        SELECT * FROM {responses}
    ), weighted AS (
        SELECT gdpo_sum::DOUBLE AS s, CASE '{batch}' WHEN 'whiten' THEN len(token_ids) ELSE 1 END AS w
        FROM stored WHERE gdpo_sum IS NOT NULL
    ), centre AS (
        SELECT sum(w * s) / sum(w) AS shift, sum(w) AS n FROM weighted
    ), spread AS (
        SELECT any_value(shift) AS shift,
               CASE WHEN any_value(n) > {batch_ddof}
                    THEN sum(w * (s - shift) ^ 2) / (any_value(n) - {batch_ddof}) ELSE 0 END AS var
        FROM weighted, centre
    ), run AS (
        SELECT CASE '{batch}' WHEN 'none' THEN 0.0 ELSE shift END AS shift,
               CASE '{batch}' WHEN 'none' THEN 1.0
                              WHEN 'std' THEN 1 / (sqrt(var) + {batch_eps})
                              ELSE 1 / sqrt(var + {batch_eps}) END AS scale
        FROM spread
    )
    SELECT stored.*,
           run.scale AS gdpo_scale,
           run.shift AS gdpo_shift,
           (run.scale * (gdpo_sum - run.shift))::FLOAT AS adv_gdpo,
           list_transform(mrtpo_sum, lambda s: (run.scale * (s - run.shift))::FLOAT) AS adv_mrtpo,
           list_transform(mc_sum, lambda s: (run.scale * (s - run.shift))::FLOAT) AS adv_mc,
           list_transform(p2t_reward,
                          lambda r: (run.scale * (gdpo_sum - run.shift) + p2t_alpha * r)::FLOAT) AS adv_p2t
    FROM stored, run;

CREATE OR REPLACE VIEW credits AS
    SELECT * FROM {credits};

-- What a trainer reads: one row per response, one float list per advantage kind, each
-- aligned with token_ids. adv_gdpo is the response advantage broadcast to every token;
-- adv_mrtpo / adv_p2t / adv_mc are NULL where that credit was not computed. sft_weight is the
-- positive part of the best available token advantage (MRTPO, else Monte-Carlo, else GDPO), so
-- token-weighted SFT imitates only the tokens that earned credit.
CREATE OR REPLACE VIEW training AS
    SELECT
        response_id,
        group_id,
        task,
        prompt,
        response,
        prompt_token_ids,
        token_ids,
        sample_logprobs,
        list_transform(token_ids, lambda t: adv_gdpo) AS adv_gdpo,
        adv_mrtpo,
        adv_p2t,
        adv_mc,
        list_transform(coalesce(adv_mrtpo, adv_mc, list_transform(token_ids, lambda t: adv_gdpo)),
                       lambda a: greatest(a, 0.0)::FLOAT) AS sft_weight,
        coalesce(list_min(rewards) >= 1.0, false) AS passed_all
    FROM responses
    WHERE status = 'ok';

-- The nodes of tree-sampled groups (empty for flat sampling): one row per node, with its token range
-- within its leaves, what it was sampled after and how many leaves lie below it.
CREATE OR REPLACE VIEW nodes AS
    SELECT * FROM {nodes};

-- One row per (leaf, node on its path): a tree-sampled response's segments joined to their nodes, with
-- the segment's tokens; join on response_id to responses or credits (position BETWEEN start AND end - 1).
CREATE OR REPLACE VIEW leaf_segments AS
    WITH unnested AS (
        SELECT response_id, group_id, token_ids, unnest(segments) AS seg FROM responses WHERE segments IS NOT NULL
    )
    SELECT u.response_id,
           u.group_id,
           n.depth,
           u.seg.node_id AS node_id,
           u.seg.parent_id AS parent_id,
           u.seg.start AS "start",
           u.seg."end" AS "end",
           u.token_ids[u.seg.start + 1 : u.seg."end"] AS token_ids,
           n.prefix_tokens,
           n.leaves
    FROM unnested u JOIN nodes n ON n.node_id = u.seg.node_id;
