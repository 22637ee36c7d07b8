-- Views over one tokencredit run directory. {responses} and {credits} are replaced by table
-- expressions over exactly the part files its manifest lists (pipeline/query.py).
CREATE OR REPLACE VIEW responses AS
    SELECT * FROM {responses};

CREATE OR REPLACE VIEW credits AS
    SELECT * FROM {credits};

-- What a trainer reads: one row per response, one float list per advantage kind, each
-- aligned with token_ids. adv_gdpo is the response advantage broadcast to every token;
-- adv_mrtpo / adv_p2t are NULL where that credit was not computed. sft_weight is the
-- positive part of the best available token advantage (MRTPO, else GDPO), so token-weighted
-- SFT imitates only the tokens that earned credit.
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
        list_transform(coalesce(adv_mrtpo, list_transform(token_ids, lambda t: adv_gdpo)),
                       lambda a: greatest(a, 0.0)::FLOAT) AS sft_weight
    FROM responses
    WHERE status = 'ok';
